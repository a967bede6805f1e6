"""Neox-style rotary embedding (Triton twin of reference.rotary).

The cos/sin table comes from reference.rope_cos_sin, so Llama-3.1 and linear scaling live in
the table; this kernel only gathers a row per token and rotates. Partial rotary (rotary dim
smaller than the head dim) passes the tail of each head through unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, INDEX_DTYPES, check_device, check_dim, check_dtype
from pdserve.kernels._common import check_last_contiguous, next_pow2
from pdserve.kernels.reference import rope_cos_sin

__all__ = ["rope_cos_sin", "rotary"]


@triton.jit
def rotated_heads(x_ptr, tok, stride_t, stride_h, cs_row, heads, head_dim,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The `heads` heads of token `tok` of x rotated, fp32 [BLOCK_H, BLOCK_D] (0 outside the
    mask, also returned): d < HALF gets x[d] cos - x[d + HALF] sin, HALF <= d < 2 HALF gets
    x[d] cos + x[d - HALF] sin (cos/sin at d mod HALF of the row cs_row), the rest passes."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    m = (h < heads) & (d < head_dim)
    src = x_ptr + tok * stride_t + h * stride_h
    rot = d < 2 * HALF
    first = d < HALF
    i = tl.where(first, d, d - HALF)
    x = tl.load(src + d, mask=m, other=0.0).to(tl.float32)
    partner = tl.load(src + tl.where(first, d + HALF, i), mask=m & rot, other=0.0).to(tl.float32)
    cos = tl.load(cs_row + i, mask=rot, other=1.0)
    sin = tl.load(cs_row + HALF + i, mask=rot, other=0.0)
    return tl.where(first, x * cos - partner * sin, x * cos + partner * sin), m


@triton.jit
def rotate_heads_into(x_ptr, out_ptr, tok, stride_t, stride_h, stride_ot, stride_oh, cs_row, heads, head_dim,
                      HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store rotated_heads of token `tok` of x into the same token of out, in out's dtype."""
    x, m = rotated_heads(x_ptr, tok, stride_t, stride_h, cs_row, heads, head_dim, HALF, BLOCK_H, BLOCK_D)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    tl.store(out_ptr + tok * stride_ot + h * stride_oh + d, x.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cs_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_cs, q_heads, k_heads, head_dim,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per token rotates its q heads and its k heads (one launch for both)."""
    tok = tl.program_id(0).to(tl.int64)
    cs_row = cs_ptr + tl.load(pos_ptr + tok).to(tl.int64) * stride_cs
    rotate_heads_into(q_ptr, qo_ptr, tok, stride_qt, stride_qh, stride_qot, stride_qoh, cs_row,
                      q_heads, head_dim, HALF, BLOCK_HQ, BLOCK_D)
    rotate_heads_into(k_ptr, ko_ptr, tok, stride_kt, stride_kh, stride_kot, stride_koh, cs_row,
                      k_heads, head_dim, HALF, BLOCK_HK, BLOCK_D)


def check_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> int:
    """Check rotary()'s arguments; returns the rotary dim (cos_sin's width)."""
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
    return rot


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style (HF rotate_half) rotary embedding of q [T, Hq, D] and k [T, Hk, D].

    positions [T] (int32/int64) index rows of cos_sin [max_position, rotary_dim] (float32).
    Returns new contiguous tensors; q and k may be strided views (e.g. of a fused qkv).
    """
    rot = check_rotary(q, k, positions, cos_sin)
    t, _, d = q.shape
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if t == 0:
        return qo, ko
    _rotary_kernel[(t,)](
        q, k, qo, ko, positions, cos_sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), qo.stride(0), qo.stride(1),
        ko.stride(0), ko.stride(1), cos_sin.stride(0), q.shape[1], k.shape[1], d,
        HALF=rot // 2, BLOCK_HQ=next_pow2(q.shape[1]), BLOCK_HK=next_pow2(k.shape[1]),
        BLOCK_D=next_pow2(d), num_warps=4,
    )
    return qo, ko
