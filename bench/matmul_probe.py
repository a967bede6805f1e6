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
from triton.testing import do_bench

from engine import CONFIGS  # bench/ is on sys.path when run as a script
from splitk_probe import checked_us, splitk
from pdserve.model.spec import ModelSpec

TILES = [  # (BM, BN, BK, warps, stages)
    (128, 64, 64, 4, 4), (128, 64, 128, 4, 3), (128, 64, 64, 4, 6), (64, 128, 64, 4, 4), (64, 128, 128, 4, 3),
    (64, 64, 128, 4, 4), (64, 64, 64, 4, 6), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (256, 64, 64, 8, 4),
    (256, 128, 64, 8, 3), (128, 32, 128, 4, 4), (64, 32, 128, 4, 5), (128, 256, 64, 8, 3), (64, 256, 64, 4, 3),
]


def mm(x: torch.Tensor, w: torch.Tensor, tile: tuple[int, ...]) -> torch.Tensor:
    """One program per output tile, the whole K each: splitk_probe's kernel with one slice."""
    out = torch.empty((1, x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    return splitk(x, w, out, tile, 1, False)[0]


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
                us = checked_us(f"M={m} {name} {tile}", lambda: mm(x, w, tile), lambda got: got, ref, 0.1)  # noqa: B023
                if us is not None:
                    best = min(best, (us, tile))
            tf = 2 * m * n * k / best[0] / 1e6
            print(f"M={m} {name:8s} N={n} K={k}: cuBLAS {cub:7.1f} us, best Triton {best[0]:7.1f} us "
                  f"({tf:.0f} TFLOP/s) {best[1]}, ratio {cub / best[0]:.2f}", flush=True)
            cublas_total += cub * counts[name]
            best_total += min(cub, best[0]) * counts[name]
        print(f"M={m} per step: cuBLAS {cublas_total / 1e3:.3f} ms, best of both {best_total / 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
