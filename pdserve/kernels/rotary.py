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
def _rotate_heads(x_ptr, out_ptr, tok, cos, sin, i, imask, stride_xt, stride_xh, stride_ot, stride_oh,
                  heads, head_dim, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_PASS: tl.constexpr):
    """Rotate the `heads` heads of one token of x into out."""
    h = tl.arange(0, BLOCK_H)[:, None]
    hmask = h < heads
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


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cs_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_cs, q_heads, k_heads, head_dim,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    """One program per token rotates its q heads and its k heads (one launch for both)."""
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    imask = i < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + i, mask=imask, other=0.0)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + i, mask=imask, other=0.0)
    _rotate_heads(q_ptr, qo_ptr, tok, cos, sin, i, imask, stride_qt, stride_qh, stride_qot, stride_qoh,
                  q_heads, head_dim, HALF, BLOCK_HQ, BLOCK_PASS)
    _rotate_heads(k_ptr, ko_ptr, tok, cos, sin, i, imask, stride_kt, stride_kh, stride_kot, stride_koh,
                  k_heads, head_dim, HALF, BLOCK_HK, BLOCK_PASS)


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
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if t == 0:
        return qo, ko
    half, rest = rot // 2, d - rot
    _rotary_kernel[(t,)](
        q, k, qo, ko, positions, cos_sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), qo.stride(0), qo.stride(1),
        ko.stride(0), ko.stride(1), cos_sin.stride(0), q.shape[1], k.shape[1], d,
        HALF=half, BLOCK_HQ=next_pow2(max(q.shape[1], 1)), BLOCK_HK=next_pow2(max(k.shape[1], 1)),
        BLOCK_HALF=next_pow2(half), BLOCK_PASS=next_pow2(rest) if rest else 0, num_warps=4,
    )
    return qo, ko
