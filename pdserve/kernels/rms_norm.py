"""RMSNorm with a fused residual add (Triton twin of reference.rms_norm)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, check_device, check_dim, check_dtype
from pdserve.kernels._common import check_last_contiguous, next_pow2


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr,
    stride_x, stride_r, stride_o, stride_s,
    hidden, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        # Round the sum to the input dtype first: the reference normalizes the rounded sum.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * stride_s + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / hidden
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = xf * tl.rsqrt(var + eps) * w
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm with a fused residual add: returns (norm(x + residual) * weight, x + residual).

    x and residual are [T, H] with unit stride in H; without a residual the second result is
    x itself (as in the reference).
    """
    check_dim("x", x, 2)
    check_dim("weight", weight, 1)
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("weight", weight, FLOAT_DTYPES)
    check_last_contiguous("x", x)
    assert weight.is_contiguous(), "weight must be contiguous"
    t, h = x.shape
    assert weight.shape[0] == h, f"weight has {weight.shape[0]} elements, x has hidden {h}"
    check_device(x=x, weight=weight, **({"residual": residual} if residual is not None else {}))
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is not None:
        assert residual.shape == x.shape, f"residual {tuple(residual.shape)} != x {tuple(x.shape)}"
        assert residual.dtype == x.dtype, f"residual dtype {residual.dtype} != x dtype {x.dtype}"
        check_last_contiguous("residual", residual)
        summed = torch.empty_like(out)
    else:
        residual, summed = x, x
    if t == 0:
        return out, summed
    block = next_pow2(h)
    _rms_norm_kernel[(t,)](
        x, residual, weight, out, summed,
        x.stride(0), residual.stride(0), out.stride(0), summed.stride(0),
        h, float(eps),
        HAS_RES=summed is not x, BLOCK=block, num_warps=min(16, max(1, block // 256)),
    )
    return out, summed
