"""Where batch-1 decode loses to the roofline (diagnostic, CUDA only).

`python bench/bs1_probe.py [--out FILE]` times, inside CUDA graphs (triton.testing.do_bench_cudagraph),
the matrix-vector products of one Llama-3.1-8B decode step through F.linear (cuBLAS) and through
pdserve.kernels.gemv over a sweep of its tiles, as GB/s of weight read over a device copy measured in
the same run; and the paged decode attention at one sequence of 128 tokens as the block-table width
(which sets the split-K partition count in a CUDA graph) grows.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench, do_bench_cudagraph

from pdserve.kernels.decode_attention import paged_decode_attention
from pdserve.kernels.gemv import gemv

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}


def us(fn) -> float:
    return do_bench_cudagraph(fn, rep=100) * 1e3


def copy_gbps() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / (do_bench(lambda: b.copy_(a), rep=200, return_mode="median") * 1e3) / 1e3


def linears(copy: float) -> dict:
    out = {}
    for name, (n, k) in SHAPES.items():
        # copies enough to overflow the 50 MB L2, each read once per timed call, as in a step
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
              for _ in range(max(1, -(-256 * 2**20 // (n * k * 2))))]
        w = ws[0]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, w)
        gb = n * k * 2 / 1e3
        row = {"cublas_us": us(lambda: [F.linear(x, wi) for wi in ws]) / len(ws), "copies": len(ws)}
        row["cublas_ratio"] = gb / row["cublas_us"] / copy
        best = None
        for bn in (4, 8, 16, 32):
            for bk in (256, 512, 1024):
                for warps in (4, 8):
                    if bn * bk > 16384:
                        continue
                    err = (gemv(x, w, block_n=bn, block_k=bk, num_warps=warps).float() - ref.float()).abs().max().item()
                    t = us(lambda: [gemv(x, wi, block_n=bn, block_k=bk, num_warps=warps) for wi in ws]) / len(ws)  # noqa: B023
                    if best is None or t < best[0]:
                        best = (t, bn, bk, warps, err)
        row |= {"gemv_us": best[0], "gemv_ratio": gb / best[0] / copy, "gemv_block_n": best[1],
                "gemv_block_k": best[2], "gemv_warps": best[3], "gemv_max_err": best[4]}
        print(name, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
              flush=True)
        out[name] = row
        ws.clear()
    return out


def attention() -> dict:
    out = {}
    pool = torch.randn(2, 4096, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([128], dtype=torch.int32, device="cuda")
    for width in (8, 64, 256, 1024, 4096):
        table = torch.arange(width, dtype=torch.int32, device="cuda").view(1, width)
        t = us(lambda: paged_decode_attention(q, pool[0], pool[1], table, lens, 128 ** -0.5))
        out[str(width)] = t
        print(f"decode attention 1 x 128 tokens, table width {width}: {t:.2f} us", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    a = p.parse_args()
    copy = copy_gbps()
    print(f"copy {copy:.0f} GB/s", flush=True)
    res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "copy_GBps": copy,
           "linear": linears(copy), "attention_us_by_table_width": attention()}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
