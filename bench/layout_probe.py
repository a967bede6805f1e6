"""Paged decode attention over two layouts of a cache block (diagnostic, CUDA only).

    python bench/layout_probe.py --out FILE.json

The pool stores a block slot-major ([S, Hk, D]: the heads of a slot side by side), so one
attention program, which reads one KV head, reads a page as S rows of D values 2 * Hk * D
bytes apart (bf16). Head-major ([Hk, S, D]) makes that page one contiguous run. This times the
real kernel (decode_with_partitions, default partition and tiles) over the same values in both
layouts, bf16 and fp8 (kv_quant's head-major blocks against the slot-major ones it had before
2026-12-06, see bench/kvquant.py's slot_major_fp8_blocks), with both grid orders, in
interleaved rounds, beside a device copy and a read-only stream; and checks that both layouts
give the same output.
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
from kernel_bench import HQ, HK, D, _ms, copy_bandwidth_gbs, quant_paged
from kvquant import slot_major_fp8_blocks
from pdserve.bench.provenance import source_commit
from pdserve.kernels.decode_attention import decode_with_partitions, default_partition_size

WIDTH = 4096  # block table tokens, as bench/engine.py builds them for a 4k model length


def pools(seqs: int, context: int, s: int, fp8: bool) -> tuple[dict[str, tuple], torch.Tensor]:
    """The same cache contents in both layouts: {layout: (k, v, k_scale, v_scale)} and tables.
    fp8: kv_quant's pool (head-major) and a second one viewed slot-major (the layout before
    2026-12-06), filled through the views with the first one's values and scales."""
    if fp8:
        *head, tables = quant_paged(seqs, context, "fp8_e4m3", WIDTH, s)
        with slot_major_fp8_blocks():
            *slot, _ = quant_paged(seqs, context, "fp8_e4m3", WIDTH, s)
        for dst, src in zip(slot[:2], head[:2]):  # fp8 values, copied as bytes
            dst.view(torch.uint8).copy_(src.view(torch.uint8))
        for dst, src in zip(slot[2:], head[2:]):  # float32 scales
            dst.copy_(src)
        return {"slot_major": tuple(slot), "head_major": tuple(head)}, tables
    need = triton.cdiv(context, s)
    n = seqs * need
    tables = torch.zeros(seqs, max(need, WIDTH // s), dtype=torch.int32, device="cuda")
    tables[:, :need] = torch.randperm(n, device="cuda").int().view(seqs, need)
    slot = torch.randn(2, n, s, HK, D, dtype=torch.bfloat16, device="cuda")
    head = torch.empty(2, n, HK, s, D, dtype=torch.bfloat16, device="cuda").transpose(2, 3)
    head.copy_(slot)
    return {"slot_major": (slot[0], slot[1], None, None), "head_major": (head[0], head[1], None, None)}, tables


def case(seqs: int, context: int, s: int, fp8: bool, rounds: int, read_gbs: float) -> dict:
    layouts, tables = pools(seqs, context, s, fp8)
    q = torch.randn(seqs, HQ, D, dtype=torch.bfloat16, device="cuda")
    lens = torch.full((seqs,), context, dtype=torch.int32, device="cuda")
    part = default_partition_size(seqs, HK, tables.shape[1] * s, q.device)
    kv_bytes = seqs * context * HK * 2 * (D + 4 if fp8 else 2 * D)  # fp8 rows carry a 4-byte scale

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
