"""The paged decode kernel's compute floor: the same launch as at 256 x 4k, but every sequence's
block table names the same pages, so the KV it reads (8.7 MB fp8, 17 MB bf16) stays in L2 and
HBM no longer bounds it (diagnostic, CUDA only).

    python bench/l2_floor.py --out FILE.json

An H100 and an H200 share the SM (132 of them, same clocks), so the floor measured on either
bounds the kernel on both: an H200 run at 4.3 TB/s cannot beat it. Prints, per cache dtype, the
served kernel's time over distinct pages (HBM) and over shared pages (L2), in interleaved rounds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics

import torch

from kernel_bench import HQ, HK, D, _ms, _paged, copy_bandwidth_gbs, quant_paged
from pdserve.bench.provenance import source_commit
from pdserve.kernels.decode_attention import paged_decode_attention


def floors(seqs: int = 256, context: int = 4096, rounds: int = 5) -> dict:
    q = torch.randn(seqs, HQ, D, dtype=torch.bfloat16, device="cuda")
    lens = torch.full((seqs,), context, dtype=torch.int32, device="cuda")
    kc8, vc8, ks, vs, t8 = quant_paged(seqs, context, "fp8_e4m3")
    ks.uniform_(0.001, 0.02)
    vs.uniform_(0.001, 0.02)
    kc, vc, t16 = _paged([context] * seqs)
    s8, s16 = (t[:1].expand(seqs, -1).contiguous() for t in (t8, t16))  # every row: sequence 0's pages
    cases = {
        "fp8_hbm": lambda: paged_decode_attention(q, kc8, vc8, t8, lens, D**-0.5, ks, vs),
        "fp8_l2": lambda: paged_decode_attention(q, kc8, vc8, s8, lens, D**-0.5, ks, vs),
        "bf16_hbm": lambda: paged_decode_attention(q, kc, vc, t16, lens, D**-0.5),
        "bf16_l2": lambda: paged_decode_attention(q, kc, vc, s16, lens, D**-0.5),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times[name].append(_ms(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"seqs": seqs, "context": context, "ms": med, "ms_rounds": times,
            "fp8_floor_over_hbm": med["fp8_l2"] / med["fp8_hbm"], "bf16_floor_over_hbm": med["bf16_l2"] / med["bf16_hbm"],
            "fp8_kv_bytes": seqs * context * HK * 2 * (D + 4), "bf16_kv_bytes": seqs * context * HK * 2 * D * 2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "commit": source_commit(), "copy_GBps": copy_bandwidth_gbs(), **floors()}
    print(json.dumps(res)[:1500])
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
