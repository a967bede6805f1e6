"""Single-row linear layer y = x @ W^T (+ b) (Triton twin of reference.linear at one token).

Batch-1 decode is a chain of matrix-vector products: every weight byte is read once and used
once, so the op is bound by memory bandwidth. cuBLAS picks split-K tiles for the narrow ones
(o, down) and pays a second reduction kernel. Here each program owns BLOCK_N output rows,
streams their whole reduction dim in BLOCK_K chunks into an fp32 register tile and reduces
it once at the end: one kernel, no workspace.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, check_device, check_dim, check_dtype
from pdserve.kernels._common import check_last_contiguous


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, n_out, k_in, stride_w,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < n_out
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_w
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            x = tl.load(x_ptr + k)
            w = tl.load(rows + k[None, :], mask=nmask[:, None], other=0.0)
        else:
            kmask = k < k_in
            x = tl.load(x_ptr + k, mask=kmask, other=0.0)
            w = tl.load(rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + n, y.to(out_ptr.dtype.element_ty), mask=nmask)


def gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    *, block_n: int = 8, block_k: int = 512, num_warps: int = 4,
) -> torch.Tensor:
    """x [1, K] @ weight[N, K]^T (+ bias [N]) -> [1, N] in x's dtype, fp32 accumulation.

    block_n (output rows per program) and block_k (reduction chunk), powers of two, and
    num_warps are tuning knobs."""
    check_dim("x", x, 2)
    check_dim("weight", weight, 2)
    check_dtype("x", x, FLOAT_DTYPES)
    assert weight.dtype == x.dtype, f"weight dtype {weight.dtype} != x dtype {x.dtype}"
    assert x.shape[0] == 1, f"gemv takes one row, x has {x.shape[0]}"
    check_last_contiguous("x", x)
    check_last_contiguous("weight", weight)
    n, k = weight.shape
    assert x.shape[1] == k, f"x has {x.shape[1]} features, weight expects {k}"
    if bias is not None:
        check_dim("bias", bias, 1)
        assert bias.shape[0] == n and bias.is_contiguous(), f"bias must be contiguous [{n}]"
        check_device(x=x, weight=weight, bias=bias)
    else:
        check_device(x=x, weight=weight)
    for name, v in (("block_n", block_n), ("block_k", block_k)):
        assert v >= 1 and v & (v - 1) == 0, f"{name} {v} must be a power of two"
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, out, n, k, weight.stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0, HAS_BIAS=bias is not None,
        num_warps=num_warps,
    )
    return out


def gemv_tiles(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps) for an [N, K] weight: the best of a sweep on an H200
    (bench/results/bs1-probe-h200-2026-12-03-s7.json) for Llama-3.1-8B's five shapes."""
    if k >= 8192:
        return 16, 1024, 8
    if n >= 16384:
        return 16, 256, 4
    return 8, 512, 4


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through gemv when x is one contiguous bf16/fp16 row (batch-1 decode)."""
    if (x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and x.stride(-1) == 1 and weight.stride(-1) == 1):
        bn, bk, warps = gemv_tiles(*weight.shape)
        return gemv(x, weight, bias, block_n=bn, block_k=bk, num_warps=warps)
    return torch.nn.functional.linear(x, weight, bias)
