"""Triton building blocks shared by the paged attention kernels.

Both kernels walk a sequence's KV in tiles of BLOCK_N tokens; a tile may span several cache
blocks (pages), so each token's page is looked up in the block table, which also lets the
tile size differ from the cache block size.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_offsets(bt_row, t, tmask, stride_cn, stride_cs, kvh, stride_sn, stride_ss, stride_sh,
                  S: tl.constexpr, QUANT: tl.constexpr):
    """Element offsets (int64) of tokens t of one sequence inside a paged cache view, and of
    their float32 scales (KV head kvh) when QUANT (else the same offsets); one table lookup."""
    page = tl.load(bt_row + t // S, mask=tmask, other=0).to(tl.int64)
    slot = (t % S).to(tl.int64)
    tok_off = page * stride_cn + slot * stride_cs
    sc_off = tok_off
    if QUANT:
        sc_off = page * stride_sn + slot * stride_ss + kvh * stride_sh
    return tok_off, sc_off


@triton.jit
def query_for(q, QUANT: tl.constexpr, DOT_F32: tl.constexpr):
    """The query as the dots take it: over a quantized cache, bf16 queries become fp16, since
    fp8/int8 convert to fp16 in one instruction (bf16 would go through fp32); fp16 holds the
    upcast tiles exactly and queries far inside its range."""
    if QUANT and not DOT_F32 and q.dtype == tl.bfloat16:
        q = q.to(tl.float16)
    return q


@triton.jit
def mm(a, b, PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    """a @ b with fp32 accumulation. DOT_F32 upcasts first: Triton's CPU interpreter
    multiplies bf16 operands as raw uint16 bits, so interpreted runs must not dot bf16."""
    if DOT_F32:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision=PRECISION)
    return c


@triton.jit
def attend_tile(
    q, kc_ptr, vc_ptr, tok_off, head_off, dmask, tmask, valid,
    m_i, l_i, acc, scale_log2, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
    ks_ptr, vs_ptr, sc_off, QUANT: tl.constexpr,
):
    """One online-softmax step of rows q [M, D] over a KV tile (log2 domain, fp32 state).

    tok_off [N]: token offsets from kv_token_offsets; head_off [D]: head * row + d;
    valid [M, N]: which (row, key) pairs attend. Every row must see at least one valid key
    in the first tile it processes, so the running max is finite from then on.
    QUANT: K/V are fp8/int8 with per-token scales at ks_ptr/vs_ptr + sc_off [N]; the K scale
    multiplies score columns and the V scale the probabilities, so tiles are only upcast
    (exactly) to q's dtype and no dequantized copy is ever written.
    """
    kmask = dmask[:, None] & tmask[None, :]
    k = tl.load(kc_ptr + tok_off[None, :] + head_off[:, None], mask=kmask, other=0.0)
    if QUANT:
        # the interpreter mis-converts int8 -> bf16; it upcasts to fp32 anyway (DOT_F32)
        k = k.to(tl.float32) if DOT_F32 else k.to(q.dtype)
    s = mm(q, k, PRECISION, DOT_F32) * scale_log2
    if QUANT:
        s = s * tl.load(ks_ptr + sc_off, mask=tmask, other=0.0)[None, :]
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    vmask = tmask[:, None] & dmask[None, :]
    v = tl.load(vc_ptr + tok_off[:, None] + head_off[None, :], mask=vmask, other=0.0)
    pv = p
    if QUANT:
        v = v.to(tl.float32) if DOT_F32 else v.to(q.dtype)
        pv = p * tl.load(vs_ptr + sc_off, mask=tmask, other=0.0)[None, :]
    acc = acc * alpha[:, None] + mm(pv.to(v.dtype), v, PRECISION, DOT_F32)
    return m_new, l_i, acc
