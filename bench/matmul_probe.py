"""Triton GEMM tiles against cuBLAS on the decode GEMMs of a large batch (diagnostic, CUDA only).

    cd bench && python3 matmul_probe.py [--model llama-3.1-8b] [--batch 256 128 64]

cuBLAS runs the M=256 projections of Llama-3.1-8B at 44-82 % of the bf16 matmul rate
(bench/results/gemm-probe-h200-2026-12-04-s9.log): too few output tiles for 132 SMs when N
is 4-6k. This times a plain Triton GEMM (x [M, K] @ W[N, K]^T, one program per output tile,
fp32 accumulation, the whole K per program) over a list of tile shapes, per projection, beside
F.linear, and prints the best tile per projection and its ratio to cuBLAS.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

from engine import CONFIGS  # bench/ is on sys.path when run as a script
from pdserve.model.spec import ModelSpec

TILES = [  # (BM, BN, BK, warps, stages)
    (128, 64, 64, 4, 4), (128, 64, 128, 4, 3), (128, 64, 64, 4, 6), (64, 128, 64, 4, 4), (64, 128, 128, 4, 3),
    (64, 64, 128, 4, 4), (64, 64, 64, 4, 6), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (256, 64, 64, 8, 4),
    (256, 128, 64, 8, 3), (128, 32, 128, 4, 4), (64, 32, 128, 4, 5), (128, 256, 64, 8, 3), (64, 256, 64, 4, 3),
]


@triton.jit
def _mm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    xp = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
    wp = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    acc = tl.zeros([BM, BN], tl.float32)
    for _ in range(0, K, BK):
        a = tl.load(xp, mask=rm[:, None] < M, other=0.0)
        b = tl.load(wp, mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        xp += BK
        wp += BK
    op = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(op, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def mm(x: torch.Tensor, w: torch.Tensor, tile: tuple[int, ...]) -> torch.Tensor:
    bm, bn, bk, warps, stages = tile
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _mm_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm))](
        x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), BM=bm, BN=bn, BK=bk,
        num_warps=warps, num_stages=stages)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 128, 64])
    args = ap.parse_args()
    spec = ModelSpec.from_config_dict(__import__("json").loads((CONFIGS / f"{args.model}.json").read_text()))
    h, d = spec.hidden_size, spec.head_dim
    shapes = {"qkv": ((spec.num_heads + 2 * spec.num_kv_heads) * d, h), "o": (h, spec.num_heads * d),
              "gate_up": (2 * spec.intermediate_size, h), "down": (h, spec.intermediate_size),
              "lm_head": (spec.vocab_size, h)}
    counts = {"qkv": spec.num_layers, "o": spec.num_layers, "gate_up": spec.num_layers, "down": spec.num_layers,
              "lm_head": 1}
    torch.manual_seed(0)
    for m in args.batch:
        cublas_total = best_total = 0.0
        for name, (n, k) in shapes.items():
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
            ref = F.linear(x, w)
            cub = do_bench(lambda: F.linear(x, w), warmup=25, rep=100, return_mode="median") * 1e3  # noqa: B023
            best = (float("inf"), None)
            for tile in TILES:
                try:
                    err = (mm(x, w, tile).float() - ref.float()).abs().max().item()
                    us = do_bench(lambda: mm(x, w, tile), warmup=25, rep=100, return_mode="median") * 1e3  # noqa: B023
                except Exception as e:  # noqa: BLE001 - a tile that does not fit is reported, not fatal
                    print(f"M={m} {name} {tile}: failed {type(e).__name__}", flush=True)
                    continue
                if err > 0.1:
                    print(f"M={m} {name} {tile}: wrong, err {err:.3f}", flush=True)
                    continue
                best = min(best, (us, tile))
            tf = 2 * m * n * k / best[0] / 1e6
            print(f"M={m} {name:8s} N={n} K={k}: cuBLAS {cub:7.1f} us, best Triton {best[0]:7.1f} us "
                  f"({tf:.0f} TFLOP/s) {best[1]}, ratio {cub / best[0]:.2f}", flush=True)
            cublas_total += cub * counts[name]
            best_total += min(cub, best[0]) * counts[name]
        print(f"M={m} per step: cuBLAS {cublas_total / 1e3:.3f} ms, best of both {best_total / 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
