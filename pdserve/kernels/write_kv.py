"""Scatter new K/V rows into the paged cache (Triton twin of reference.write_kv).

With k_scale/v_scale the cache is fp8 e4m3 or int8: each (token, KV head) row is quantized
symmetrically on the fly (scale = max(amax / QMAX, 1e-8), stored beside the pool)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, INDEX_DTYPES, check_cache, check_device, check_dim
from pdserve.kernels._common import check_dtype, check_last_contiguous, check_scales, next_pow2
from pdserve.kernels.reference import QUANT_MAX


@triton.jit
def store_row(x, c_ptr, s_ptr, dst, sdst, m, hmask, QUANT: tl.constexpr, QMAX: tl.constexpr,
               IS_INT: tl.constexpr):
    """Store rows x [H, D] at dst; quantized: x / scale at dst and the [H] scales at sdst."""
    if QUANT:
        xf = x.to(tl.float32)
        sc = tl.maximum(tl.max(tl.abs(xf), 1) / QMAX, 1e-8)
        xq = tl.minimum(tl.maximum(xf / sc[:, None], -QMAX), QMAX)
        if IS_INT:
            xq = tl.minimum(tl.floor(xq + 0.5), QMAX)
        tl.store(c_ptr + dst, xq.to(c_ptr.dtype.element_ty), mask=m)
        tl.store(s_ptr + sdst, sc, mask=hmask)
    else:
        tl.store(c_ptr + dst, x.to(c_ptr.dtype.element_ty), mask=m)


@triton.jit
def slot_offsets(slot, heads, head_dim, stride_cn, stride_cs, stride_ch, stride_sn, stride_ss, stride_sh,
                 S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Where the rows of one token go: element offsets [H, D] and scale offsets [H] of its
    slot (block * S + offset), and their masks; a negative slot (padding) masks everything."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    live_heads = tl.where(slot >= 0, heads, 0)
    m = (h < live_heads) & (d < head_dim)
    dst = (slot // S) * stride_cn + (slot % S) * stride_cs + h * stride_ch + d
    hv = tl.arange(0, BLOCK_H)
    sdst = (slot // S) * stride_sn + (slot % S) * stride_ss + hv * stride_sh
    return dst, sdst, m, hv < live_heads


@triton.jit
def token_rows(ptr, tok, stride_t, stride_h, m, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The [BLOCK_H, BLOCK_D] head rows of token `tok` of a [T, H, D] tensor (0 outside m)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    return tl.load(ptr + tok * stride_t + h * stride_h + d, mask=m, other=0.0)


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cn, stride_cs, stride_ch,
    stride_sn, stride_ss, stride_sh, heads, head_dim,
    S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr, QMAX: tl.constexpr, IS_INT: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    dst, sdst, m, hmask = slot_offsets(slot, heads, head_dim, stride_cn, stride_cs, stride_ch,
                                       stride_sn, stride_ss, stride_sh, S, BLOCK_H, BLOCK_D)
    k = token_rows(k_ptr, tok, stride_kt, stride_kh, m, BLOCK_H, BLOCK_D)
    v = token_rows(v_ptr, tok, stride_vt, stride_vh, m, BLOCK_H, BLOCK_D)
    store_row(k, kc_ptr, ks_ptr, dst, sdst, m, hmask, QUANT, QMAX, IS_INT)
    store_row(v, vc_ptr, vs_ptr, dst, sdst, m, hmask, QUANT, QMAX, IS_INT)


def check_write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
) -> bool:
    """Check write_kv()'s arguments; True if the cache is quantized."""
    quant = check_scales(k_cache, k_scale, v_scale)
    for name, t in (("k", k), ("v", v)):
        check_dim(name, t, 3)
        check_dtype(name, t, FLOAT_DTYPES)
        check_last_contiguous(name, t)
    check_cache("k_cache", k_cache)
    check_cache("v_cache", v_cache)
    assert k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} differ"
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride(), (
        "k_cache and v_cache must share shape and strides"
    )
    assert k_cache.dtype == v_cache.dtype, "k_cache and v_cache dtypes differ"
    assert k.shape[1:] == k_cache.shape[2:], (
        f"k rows {tuple(k.shape[1:])} do not match cache (Hk, D) {tuple(k_cache.shape[2:])}"
    )
    check_dim("slot_mapping", slot_mapping, 1)
    check_dtype("slot_mapping", slot_mapping, INDEX_DTYPES)
    assert slot_mapping.is_contiguous(), "slot_mapping must be contiguous"
    assert slot_mapping.shape[0] == k.shape[0], (
        f"slot_mapping has {slot_mapping.shape[0]} entries for {k.shape[0]} tokens"
    )
    check_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    return quant


def cache_args(k_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
               quant: bool) -> tuple[tuple, dict]:
    """The kernels' cache arguments: (k scales, v scales, 3 cache strides, 3 scale strides) and
    the constexprs S, QUANT, QMAX, IS_INT (unquantized: the cache stands in for the scales)."""
    ks, vs = (k_scale, v_scale) if quant else (k_cache, k_cache)
    args = (ks, vs, *k_cache.stride()[:3], *(ks.stride()[:3] if quant else (0, 0, 0)))
    consts = {"S": k_cache.shape[1], "QUANT": quant, "QMAX": QUANT_MAX.get(k_cache.dtype, 1.0),
              "IS_INT": k_cache.dtype == torch.int8}
    return args, consts


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store k, v [T, Hk, D] into the paged cache at flat slots (block * S + offset).

    The caches [N, S, Hk, D] may be layer views of a bigger pool (any block stride).
    Unlike the reference, a negative slot skips its token (padding). With k_scale/v_scale
    [N, S, Hk] float32 the caches are fp8/int8 and rows are quantized on write.
    """
    quant = check_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    t, hk, d = k.shape
    if t == 0:
        return
    (ks, vs, *strides), consts = cache_args(k_cache, k_scale, v_scale, quant)
    _write_kv_kernel[(t,)](
        k, v, k_cache, v_cache, slot_mapping, ks, vs,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), *strides, hk, d,
        BLOCK_H=next_pow2(hk), BLOCK_D=next_pow2(d), **consts, num_warps=4,
    )
