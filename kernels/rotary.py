"""Neox-style rotary embedding (Triton twin of reference.rotary).

The cos/sin table comes from reference.rope_cos_sin, so Llama-3.1 and linear scaling live in
the table; this kernel only gathers a row per token and rotates. Partial rotary (rotary dim
smaller than the head dim) passes the tail of each head through unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import FLOAT_DTYPES, INDEX_DTYPES, check_device, check_dim, check_dtype
from kernels._common import check_last_contiguous, next_pow2
from kernels.reference import rope_cos_sin

__all__ = ["rope_cos_sin", "rotary"]


@triton.jit
def _rotary_kernel(
    x_ptr, out_ptr, pos_ptr, cs_ptr,
    stride_xt, stride_xh, stride_ot, stride_oh, stride_cs,
    heads, head_dim,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    hmask = h < heads
    imask = i < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + i, mask=imask, other=0.0)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + i, mask=imask, other=0.0)
    src = x_ptr + tok * stride_xt + h * stride_xh
    dst = out_ptr + tok * stride_ot + h * stride_oh
    m = hmask & imask
    x1 = tl.load(src + i, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i, mask=m, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    tl.store(dst + i, (x1 * cos - x2 * sin).to(ty), mask=m)
    tl.store(dst + HALF + i, (x2 * cos + x1 * sin).to(ty), mask=m)
    if BLOCK_PASS > 0:
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, :]
        pm = hmask & (p < head_dim)
        tl.store(dst + p, tl.load(src + p, mask=pm, other=0.0), mask=pm)


def _rotate(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate one tensor [T, H, D] into a new contiguous tensor."""
    t, heads, d = x.shape
    half = cos_sin.shape[1] // 2
    out = torch.empty((t, heads, d), dtype=x.dtype, device=x.device)
    if t == 0 or heads == 0:
        return out
    rest = d - 2 * half
    _rotary_kernel[(t,)](
        x, out, positions, cos_sin,
        x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos_sin.stride(0),
        heads, d,
        HALF=half, BLOCK_H=next_pow2(heads), BLOCK_HALF=next_pow2(half),
        BLOCK_PASS=next_pow2(rest) if rest else 0, num_warps=4,
    )
    return out


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style (HF rotate_half) rotary embedding of q [T, Hq, D] and k [T, Hk, D].

    positions [T] (int32/int64) index rows of cos_sin [max_position, rotary_dim] (float32).
    Returns new contiguous tensors; q and k may be strided views (e.g. of a fused qkv).
    """
    check_dim("q", q, 3)
    check_dim("k", k, 3)
    check_dim("positions", positions, 1)
    check_dim("cos_sin", cos_sin, 2)
    check_dtype("q", q, FLOAT_DTYPES)
    assert k.dtype == q.dtype, f"k dtype {k.dtype} != q dtype {q.dtype}"
    check_dtype("positions", positions, INDEX_DTYPES)
    check_dtype("cos_sin", cos_sin, (torch.float32,))
    check_last_contiguous("q", q)
    check_last_contiguous("k", k)
    assert positions.is_contiguous(), "positions must be contiguous"
    assert cos_sin.is_contiguous(), "cos_sin must be contiguous"
    t, _, d = q.shape
    assert k.shape[0] == t and positions.shape[0] == t, (
        f"q ({t}), k ({k.shape[0]}) and positions ({positions.shape[0]}) token counts differ"
    )
    assert k.shape[2] == d, f"q head dim {d} != k head dim {k.shape[2]}"
    rot = cos_sin.shape[1]
    assert rot % 2 == 0 and 0 < rot <= d, f"cos_sin width {rot} must be even and <= head dim {d}"
    check_device(q=q, k=k, positions=positions, cos_sin=cos_sin)
    return _rotate(q, positions, cos_sin), _rotate(k, positions, cos_sin)
