"""SiLU-and-multiply of a fused gate/up projection (Triton twin of reference.silu_and_mul)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, check_device, check_dim, check_dtype
from pdserve.kernels._common import check_last_contiguous, next_pow2


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> silu(x[:, :I]) * x[:, I:], computed in fp32, stored in x's dtype."""
    check_dim("x", x, 2)
    check_dtype("x", x, FLOAT_DTYPES)
    check_last_contiguous("x", x)
    check_device(x=x)
    t, two_i = x.shape
    assert two_i % 2 == 0, f"x's last dim ({two_i}) must be even (gate and up halves)"
    inter = two_i // 2
    out = torch.empty((t, inter), dtype=x.dtype, device=x.device)
    if t == 0 or inter == 0:
        return out
    block = min(1024, next_pow2(inter))
    grid = (t, triton.cdiv(inter, block))
    _silu_and_mul_kernel[grid](x, out, x.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4)
    return out
