"""Kernel micro-benchmarks (CUDA only; never imported by tests).

paged_decode_attention at 64 seqs x 4k context (GB/s of KV read, vs a measured device copy)
for the default split-K heuristic and fixed partition sizes, and paged_prefill_attention at
2k tokens (TFLOP/s, causal FLOPs), with torch SDPA on contiguous tensors as a yardstick.
Times are triton.testing.do_bench medians. Usage: python bench/kernels.py --out FILE.json
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from pdserve.bench.provenance import source_commit
from pdserve.kernels.decode_attention import decode_with_partitions, default_partition_size, paged_decode_attention
from pdserve.kernels.prefill_attention import paged_prefill_attention

HQ, HK, D, S = 32, 8, 128, 16
DTYPE = torch.bfloat16


def _ms(fn: Callable[[], object]) -> float:
    """Median milliseconds of fn."""
    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / (_ms(lambda: dst.copy_(src)) * 1e-3) / 1e9


def _paged(seq_lens: list[int], width: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A one-layer pool with shuffled blocks: (k_cache, v_cache, block_tables); the tables are
    `width` tokens wide if that is more than the longest sequence needs."""
    need = [triton.cdiv(n, S) for n in seq_lens]
    pool = torch.randn(1, 2, sum(need), S, HK, D, dtype=DTYPE, device="cuda")
    ids = torch.randperm(sum(need), device="cuda").int()
    tables = torch.zeros(len(seq_lens), max(max(need), width // S), dtype=torch.int32, device="cuda")
    at = 0
    for b, n in enumerate(need):
        tables[b, :n] = ids[at : at + n]
        at += n
    return pool[0, 0], pool[0, 1], tables


def bench_decode(seqs: int, context: int, copy_gbs: float) -> list[dict]:
    """Decode rows: default heuristic plus fixed partition sizes."""
    kc, vc, tables = _paged([context] * seqs)
    lens = torch.full((seqs,), context, dtype=torch.int32, device="cuda")
    q = torch.randn(seqs, HQ, D, dtype=DTYPE, device="cuda")
    kv_bytes = seqs * context * HK * D * 2 * kc.element_size()
    variants: list[tuple[str, Callable[[], object]]] = [
        ("auto", lambda: paged_decode_attention(q, kc, vc, tables, lens, D**-0.5))
    ]
    for part in (context, 2048, 1024, 512, 256):
        variants.append((f"part={part}", lambda p=part: decode_with_partitions(
            q, kc, vc, tables, lens, D**-0.5, p)))
    rows = []
    for name, fn in variants:
        ms = _ms(fn)
        gbs = kv_bytes / (ms * 1e-3) / 1e9
        rows.append({"op": "decode", "variant": name, "seqs": seqs, "context": context,
                     "ms": ms, "gb_s": gbs, "frac_of_copy": gbs / copy_gbs})
    return rows


def quant_paged(seqs: int, context: int, kv: str = "fp8_e4m3", width: int = 0, block_size: int = S
                ) -> tuple[torch.Tensor, ...]:
    """A one-layer quantized pool (values + per-token scales) of `seqs` sequences of `context`
    tokens in shuffled blocks of block_size tokens: (k_cache, v_cache, k_scale, v_scale,
    block_tables), the tables `width` tokens wide if that is more than `context` needs."""
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.kv_quant import allocate_quant_pool, layer_views

    spec = ModelSpec.from_config_dict(dict(model_type="llama", hidden_size=HQ * D, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=HQ,
                                           num_key_value_heads=HK, vocab_size=128))
    need = triton.cdiv(context, block_size)
    pool = allocate_quant_pool(spec, seqs * need, block_size, kv, "cuda")
    pool.view(torch.uint8).random_(0, 120)  # finite fp8 values, positive scales
    kc, vc, ks, vs = layer_views(pool, 0, D)
    tables = torch.zeros(seqs, max(need, width // block_size), dtype=torch.int32, device="cuda")
    tables[:, :need] = torch.randperm(seqs * need, device="cuda").int().view(seqs, need)
    return kc, vc, ks, vs, tables


def bench_decode_quant(seqs: int, context: int, copy_gbs: float, kv: str = "fp8_e4m3") -> list[dict]:
    """The default-heuristic decode over a quantized pool (values + per-token scales), same shape."""
    kc, vc, ks, vs, tables = quant_paged(seqs, context, kv)
    lens = torch.full((seqs,), context, dtype=torch.int32, device="cuda")
    q = torch.randn(seqs, HQ, D, dtype=DTYPE, device="cuda")
    kv_bytes = seqs * context * HK * (D + 4) * 2
    part = default_partition_size(seqs, HK, context, q.device)
    variants = [("auto", lambda: paged_decode_attention(q, kc, vc, tables, lens, D**-0.5, ks, vs))]
    for bn, warps, stages in ((64, 4, 2), (128, 4, 3), (128, 4, 4), (256, 4, 2), (256, 8, 3), (128, 2, 2)):
        variants.append((f"block_n={bn} warps={warps} stages={stages}",
                         lambda bn=bn, w=warps, st=stages: decode_with_partitions(
                             q, kc, vc, tables, lens, D**-0.5, part, ks, vs, block_n=bn, num_warps=w,
                             num_stages=st)))
    rows = []
    for name, fn in variants:
        ms = _ms(fn)
        gbs = kv_bytes / (ms * 1e-3) / 1e9
        rows.append({"op": "decode", "variant": f"{name} {kv}", "seqs": seqs, "context": context, "ms": ms,
                     "gb_s": gbs, "frac_of_copy": gbs / copy_gbs})
    return rows


def _causal_flops(new: int, prefix: int) -> float:
    """QK^T and PV FLOPs of causal attention of `new` queries after `prefix` cached tokens."""
    keys = new * prefix + new * (new + 1) / 2
    return 4.0 * HQ * D * keys


def bench_prefill(tokens: int, prefix: int) -> list[dict]:
    """One sequence of `tokens` new tokens after `prefix` cached ones, plus SDPA yardstick."""
    total = prefix + tokens
    kc, vc, tables = _paged([total])
    lens = torch.tensor([total], dtype=torch.int32, device="cuda")
    qsl = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
    q = torch.randn(tokens, HQ, D, dtype=DTYPE, device="cuda")
    flops = _causal_flops(tokens, prefix)
    ms = _ms(lambda: paged_prefill_attention(q, kc, vc, tables, lens, qsl, D**-0.5))
    rows = [{"op": "prefill", "variant": "triton paged", "tokens": tokens, "prefix": prefix,
             "ms": ms, "tflop_s": flops / (ms * 1e-3) / 1e12}]
    if prefix == 0:
        qt = q.transpose(0, 1)[None].contiguous()
        kt = torch.randn(1, HK, tokens, D, dtype=DTYPE, device="cuda")
        sdpa = torch.nn.functional.scaled_dot_product_attention
        try:
            ms = _ms(lambda: sdpa(qt, kt, kt, is_causal=True, enable_gqa=True))
            rows.append({"op": "prefill", "variant": "torch sdpa (contiguous)", "tokens": tokens,
                         "prefix": 0, "ms": ms, "tflop_s": flops / (ms * 1e-3) / 1e12})
        except (RuntimeError, TypeError) as e:
            print(f"sdpa yardstick skipped: {e}")
    return rows


def _meta() -> dict:
    """GPU, versions, date and commit for the results file."""
    commit = source_commit()
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "shape": {"q_heads": HQ, "kv_heads": HK, "head_dim": D, "block_size": S,
                      "dtype": str(DTYPE)}}


def _print_table(rows: list[dict]) -> None:
    """One line per measurement."""
    print(f"{'op':8} {'variant':26} {'ms':>9} {'GB/s':>8} {'of copy':>8} {'TFLOP/s':>8}")
    for r in rows:
        gbs = f"{r['gb_s']:8.0f}" if "gb_s" in r else " " * 8
        frac = f"{r['frac_of_copy']:8.2f}" if "frac_of_copy" in r else " " * 8
        tf = f"{r['tflop_s']:8.1f}" if "tflop_s" in r else " " * 8
        print(f"{r['op']:8} {r['variant']:26} {r['ms']:9.4f} {gbs} {frac} {tf}")


def main() -> None:
    """Run the benchmarks, print a table, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="JSON results file")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "bench/kernels.py needs a CUDA GPU"
    torch.manual_seed(0)
    copy_gbs = copy_bandwidth_gbs()
    print(f"device copy bandwidth: {copy_gbs:.0f} GB/s (read + write)")
    rows = bench_decode(args.seqs, args.context, copy_gbs)
    rows += bench_decode_quant(args.seqs, args.context, copy_gbs)
    rows += bench_decode(256, args.context, copy_gbs)[:1] + bench_decode_quant(256, args.context, copy_gbs)
    rows += bench_prefill(args.prefill_tokens, 0)
    rows += bench_prefill(args.prefill_tokens, args.prefill_tokens)
    _print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**_meta(), "copy_gb_s": copy_gbs, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
