"""Rotary embedding and the KV write in one kernel (Triton twin of reference.rotary_write_kv).

A layer's new keys are rotated only to be stored in the paged cache, so one program per token
rotates its query heads into a new q tensor and its key heads straight into the cache slot
(quantized there when the cache is fp8/int8), and stores its value heads: one launch instead
of rotary() and write_kv(), with the same rounding (the rotated key rounded to q's dtype, then
stored or quantized as write_kv does).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import next_pow2
from pdserve.kernels.rotary import check_rotary, rotate_heads_into, rotated_heads
from pdserve.kernels.write_kv import cache_args, check_write_kv, slot_offsets, store_row, token_rows


@triton.jit
def _rotary_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, pos_ptr, cs_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_qot, stride_qoh,
    stride_cos, stride_cn, stride_cs, stride_ch, stride_sn, stride_ss, stride_sh,
    q_heads, k_heads, head_dim,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
    S: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr, IS_INT: tl.constexpr,
):
    """One program per token: its q heads rotated into qo (also for a padding token), its k
    heads rotated and rounded to k's dtype, then stored like write_kv with its v heads."""
    tok = tl.program_id(0).to(tl.int64)
    cs_row = cs_ptr + tl.load(pos_ptr + tok).to(tl.int64) * stride_cos
    rotate_heads_into(q_ptr, qo_ptr, tok, stride_qt, stride_qh, stride_qot, stride_qoh, cs_row,
                      q_heads, head_dim, HALF, BLOCK_HQ, BLOCK_D)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    dst, sdst, m, hmask = slot_offsets(slot, k_heads, head_dim, stride_cn, stride_cs, stride_ch,
                                       stride_sn, stride_ss, stride_sh, S, BLOCK_HK, BLOCK_D)
    k, _ = rotated_heads(k_ptr, tok, stride_kt, stride_kh, cs_row, k_heads, head_dim, HALF, BLOCK_HK, BLOCK_D)
    store_row(k.to(k_ptr.dtype.element_ty), kc_ptr, ks_ptr, dst, sdst, m, hmask, QUANT, QMAX, IS_INT)
    v = token_rows(v_ptr, tok, stride_vt, stride_vh, m, BLOCK_HK, BLOCK_D)
    store_row(v, vc_ptr, vs_ptr, dst, sdst, m, hmask, QUANT, QMAX, IS_INT)


def rotary_write_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """rotary(q, k, positions, cos_sin), then write_kv(rotated k, v, ...): returns the rotated
    q (a new contiguous tensor); the rotated k exists only in the cache. Arguments as in
    those two (q, k, v may be strided views of a fused qkv; a negative slot skips its token)."""
    rot = check_rotary(q, k, positions, cos_sin)
    quant = check_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    t, hq, d = q.shape
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if t == 0:
        return qo
    (ks, vs, *strides), consts = cache_args(k_cache, k_scale, v_scale, quant)
    _rotary_write_kv_kernel[(t,)](
        q, k, v, qo, positions, cos_sin, k_cache, v_cache, slot_mapping, ks, vs,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        qo.stride(0), qo.stride(1), cos_sin.stride(0), *strides, hq, k.shape[1], d,
        HALF=rot // 2, BLOCK_HQ=next_pow2(hq), BLOCK_HK=next_pow2(k.shape[1]), BLOCK_D=next_pow2(d),
        **consts, num_warps=4,
    )
    return qo
