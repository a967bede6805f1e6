"""Paged decode attention over two layouts of a cache block (diagnostic, CUDA only).

    python bench/layout_probe.py --out FILE.json

The pool stores a block slot-major ([S, Hk, D]: the heads of a slot side by side), so one
attention program, which reads one KV head, reads a page as S rows of D values 2 * Hk * D
bytes apart (bf16). Head-major ([Hk, S, D]) makes that page one contiguous run. This times the
real kernel (decode_with_partitions, default partition and tiles) over the same values in both
layouts, bf16 and fp8 (values then per-token scales, head-major, as kv_quant packs them), with
both grid orders, in interleaved rounds, beside a device copy and a read-only stream; and
checks that both layouts give the same output.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
from pathlib import Path

import torch
import triton

from attn_waves import read_bandwidth_gbs
from kernel_bench import HQ, HK, D, _ms, copy_bandwidth_gbs
from pdserve.bench.provenance import source_commit
from pdserve.kernels.decode_attention import decode_with_partitions, default_partition_size

WIDTH = 4096  # block table tokens, as bench/engine.py builds them for a 4k model length
SCALE = 4  # bytes of one fp32 scale


def _views(block: torch.Tensor, s: int, row: int, head_major: bool) -> torch.Tensor:
    """[N, S, Hk, D] view of the first S * Hk * row elements of each block row."""
    n = block.shape[0]
    strides = (block.stride(0), row, s * row, 1) if head_major else (block.stride(0), HK * row, row, 1)
    return block.as_strided((n, s, HK, D), strides, block.storage_offset())


def pools(seqs: int, context: int, s: int, fp8: bool) -> dict[str, tuple]:
    """The same cache contents in both layouts: {layout: (k, v, k_scale, v_scale)} and tables."""
    need = triton.cdiv(context, s)
    n = seqs * need
    tables = torch.zeros(seqs, max(need, WIDTH // s), dtype=torch.int32, device="cuda")
    tables[:, :need] = torch.randperm(n, device="cuda").int().view(seqs, need)
    out = {}
    if fp8:
        vals = torch.randint(0, 120, (2, n, s, HK, D), dtype=torch.uint8, device="cuda")
        scales = torch.rand(2, n, HK, s, device="cuda") + 0.5  # head-major, as kv_quant stores them
        for name, hm in (("slot_major", False), ("head_major", True)):
            blk = torch.empty(2, n, s * HK * D + s * HK * SCALE, dtype=torch.uint8, device="cuda")
            body = vals.transpose(2, 3) if hm else vals
            blk[:, :, : s * HK * D] = body.reshape(2, n, -1)
            blk[:, :, s * HK * D:] = scales.reshape(2, n, -1).view(torch.uint8).view(2, n, -1)
            blk = blk.view(torch.float8_e4m3fn)
            kv = [_views(blk[i], s, D, hm) for i in range(2)]
            sc = [blk[i].view(torch.uint8)[:, s * HK * D:].view(torch.float32).view(n, HK, s).transpose(1, 2)
                  for i in range(2)]
            out[name] = (kv[0], kv[1], sc[0], sc[1])
    else:
        vals = torch.randn(2, n, s, HK, D, dtype=torch.bfloat16, device="cuda")
        out["slot_major"] = (vals[0], vals[1], None, None)
        hm = vals.transpose(2, 3).contiguous()  # [2, n, Hk, s, D]
        out["head_major"] = (hm[0].transpose(1, 2), hm[1].transpose(1, 2), None, None)
    return out, tables


def case(seqs: int, context: int, s: int, fp8: bool, rounds: int, read_gbs: float) -> dict:
    layouts, tables = pools(seqs, context, s, fp8)
    q = torch.randn(seqs, HQ, D, dtype=torch.bfloat16, device="cuda")
    lens = torch.full((seqs,), context, dtype=torch.int32, device="cuda")
    part = default_partition_size(seqs, HK, tables.shape[1] * s, q.device)
    kv_bytes = seqs * context * HK * 2 * (D + SCALE if fp8 else 2 * D)

    def run(layout: str, heads_first: bool) -> torch.Tensor:
        k, v, ks, vs = layouts[layout]
        return decode_with_partitions(q, k, v, tables, lens, D**-0.5, part, ks, vs, heads_first=heads_first)

    ref = run("slot_major", True)
    same = bool(torch.equal(ref, run("head_major", True)))
    variants = list(itertools.product(("slot_major", "head_major"), (True, False)))
    times: dict[str, list[float]] = {f"{lay}/{'heads_first' if hf else 'seqs_first'}": [] for lay, hf in variants}
    for _ in range(rounds):
        for lay, hf in variants:
            times[f"{lay}/{'heads_first' if hf else 'seqs_first'}"].append(_ms(lambda: run(lay, hf)))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["slot_major/heads_first"]
    res = {"kv": "fp8" if fp8 else "bf16", "seqs": seqs, "context": context, "block_size": s, "part": part,
           "same_output": same, "ms": med, "ms_rounds": times,
           "frac_of_read": {k: kv_bytes / (m * 1e-3) / 1e9 / read_gbs for k, m in med.items()},
           "speedup_vs_slot_major": {k: base / m for k, m in med.items()}}
    print(f"{res['kv']} {seqs}x{context} S={s} part={part} same={same} "
          + " ".join(f"{k}:{m:.4f}ms({res['frac_of_read'][k]:.3f})" for k, m in med.items()), flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cases", default="bf16:256x1024,bf16:64x4096,bf16:32x1024,fp8:256x4096,fp8:64x4096")
    p.add_argument("--block-sizes", default="16,32")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "commit": source_commit() or "unknown", "copy_GBps": copy_bandwidth_gbs(), "read": read_bandwidth_gbs()}
    print(f"copy {res['copy_GBps']:.0f} GB/s, read {res['read']}", flush=True)
    res["cases"] = []
    for spec, s in itertools.product(a.cases.split(","), map(int, a.block_sizes.split(","))):
        kv, shape = spec.split(":")
        seqs, context = map(int, shape.split("x"))
        res["cases"].append(case(seqs, context, s, kv == "fp8", a.rounds, res["read"]["gb_s"]))
        torch.cuda.empty_cache()
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
