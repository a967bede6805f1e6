"""Split-K Triton GEMMs and cuBLAS call forms on the decode GEMMs of a large batch (diagnostic, CUDA only).

    cd bench && python3 splitk_probe.py [--model llama-3.1-8b] [--batch 256 128]

At batch 256 the o and qkv projections of Llama-3.1-8B give cuBLAS 32-64 output tiles of
128x128 for 132 SMs (gemm-probe-h200-2026-12-04-s9.log: 348-475 TFLOP/s against ~790). This
times, per projection:
- F.linear (what pdserve calls), and the transposed product W @ x^T (cuBLAS sees M and N swapped
  and picks other tiles);
- a Triton GEMM whose K is cut into S slices, one program per (tile, slice), fp32 results either
  summed with atomics into a zeroed buffer ("atomic") or written as S partial planes ("planes";
  the next kernel would sum them while it reads its input). Timed without that sum; the cost of
  summing the planes alone is printed beside.
Microseconds are medians of triton.testing.do_bench (L2 flushed between runs).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

from engine import CONFIGS  # bench/ is on sys.path when run as a script
from pdserve.model.spec import ModelSpec

TILES = [  # (BM, BN, BK, warps, stages)
    (64, 64, 128, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 8, 3),
    (64, 64, 64, 4, 6), (128, 64, 128, 8, 3), (64, 128, 128, 4, 3), (128, 128, 128, 8, 3),
]
SPLITS = (1, 2, 3, 4, 6, 8)


@triton.jit
def _splitk_kernel(x_ptr, w_ptr, out_ptr, M, N, K, K_PER, stride_xm, stride_wn,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ATOMIC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    k0 = pid_k * K_PER
    rk = k0 + tl.arange(0, BK)
    xp = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
    wp = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    acc = tl.zeros([BM, BN], tl.float32)
    for _ in range(0, K_PER, BK):
        a = tl.load(xp, mask=rm[:, None] < M, other=0.0)
        b = tl.load(wp, mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        xp += BK
        wp += BK
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if ATOMIC:
        op = out_ptr + rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.atomic_add(op, acc, mask=mask, sem="relaxed")
    else:
        op = out_ptr + pid_k.to(tl.int64) * M * N + rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(op, acc.to(out_ptr.dtype.element_ty), mask=mask)


def splitk(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tile: tuple[int, ...], s: int,
           atomic: bool) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T into out: with atomic, fp32 [M, N] (zeroed here) summed over the S
    slices; else [S, M, N] planes, one per slice, in out's dtype (S=1: a plain GEMM)."""
    bm, bn, bk, warps, stages = tile
    m, k = x.shape
    n = w.shape[0]
    k_per = k // s
    if atomic:
        out.zero_()
    _splitk_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm), s)](
        x, w, out, m, n, k, k_per, x.stride(0), w.stride(0), BM=bm, BN=bn, BK=bk, ATOMIC=atomic,
        num_warps=warps, num_stages=stages)
    return out


def _us(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def checked_us(label: str, run: Callable[[], torch.Tensor], result: Callable[[torch.Tensor], torch.Tensor],
               ref: torch.Tensor, tol: float) -> float | None:
    """Microseconds of run(), or None (printed under label) when it fails to compile or launch,
    or result(run()) is off ref by more than tol."""
    try:
        err = (result(run()).float() - ref.float()).abs().max().item()
        us = _us(run)
    except Exception as e:  # noqa: BLE001 - a tile that does not fit is reported, not fatal
        print(f"{label}: failed {type(e).__name__}", flush=True)
        return None
    if err > tol:
        print(f"{label}: wrong, err {err:.3f}", flush=True)
        return None
    return us


def probe(name: str, m: int, n: int, k: int) -> dict:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    ref = F.linear(x, w).float()
    row = {"cublas_us": _us(lambda: F.linear(x, w)),
           "cublas_transposed_us": _us(lambda: torch.mm(w, x.t())),
           "cublas_transposed_copy_us": _us(lambda: torch.mm(w, x.t()).t().contiguous())}
    atomic_out = torch.empty(m, n, device="cuda", dtype=torch.float32)
    best: dict[str, tuple[float, str]] = {}
    for atomic in (True, False):
        mode = "atomic" if atomic else "planes"
        for s in SPLITS:
            planes = torch.empty(s, m, n, device="cuda", dtype=torch.float32)
            for tile in TILES:
                if k % (s * tile[2]):
                    continue
                out = atomic_out if atomic else planes
                run = lambda: splitk(x, w, out, tile, s, atomic)  # noqa: B023, E731
                us = checked_us(f"  {name} M={m} {mode} S={s} {tile}", run,
                                lambda got: got if atomic else got.sum(0), ref, 0.05)  # noqa: B023
                if us is not None and us < best.get(mode, (float("inf"), ""))[0]:
                    best[mode] = (us, f"S={s} {tile}")
        row[f"{mode}_us"], row[f"{mode}_config"] = best.get(mode, (float("nan"), "none"))
    s_best = int(row["planes_config"].split()[0][2:]) if row["planes_config"] != "none" else 1
    planes = torch.randn(s_best, m, n, device="cuda", dtype=torch.float32)
    row["planes_sum_us"] = _us(lambda: planes.sum(0))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 128])
    ap.add_argument("--only", nargs="*", default=None, help="projection names to probe")
    args = ap.parse_args()
    spec = ModelSpec.from_config_dict(json.loads((CONFIGS / f"{args.model}.json").read_text()))
    h, d = spec.hidden_size, spec.head_dim
    shapes = {"qkv": ((spec.num_heads + 2 * spec.num_kv_heads) * d, h), "o": (h, spec.num_heads * d),
              "gate_up": (2 * spec.intermediate_size, h), "down": (h, spec.intermediate_size)}
    torch.manual_seed(0)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ a, warmup=25, rep=100, return_mode="median")
    print(f"{torch.cuda.get_device_name()}: square 8192 matmul {2 * 8192 ** 3 / ms / 1e9:.0f} TFLOP/s", flush=True)
    for m in args.batch:
        for name, (n, k) in shapes.items():
            if args.only and name not in args.only:
                continue
            row = probe(name, m, n, k)
            tf = 2 * m * n * k / 1e6
            print(f"M={m} {name:8s} N={n} K={k}: cuBLAS {row['cublas_us']:6.1f} us ({tf / row['cublas_us']:.0f} TF/s), "
                  f"W@x^T {row['cublas_transposed_us']:6.1f} (+copy {row['cublas_transposed_copy_us']:6.1f}), "
                  f"atomic {row['atomic_us']:6.1f} [{row['atomic_config']}], "
                  f"planes {row['planes_us']:6.1f} [{row['planes_config']}] + sum {row['planes_sum_us']:.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
