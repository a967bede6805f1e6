"""fp8 tensor-core dots for the fp8 paged decode attention (diagnostic, CUDA only).

`python bench/fp8_dot_probe.py` times a stripped decode kernel (one program per sequence and KV
head, no split-K) over an fp8 pool of the Llama-3.1-8B head shape, 256 x 4k, with switches:
QK8: the query quantized to fp8 (per-row scale) and QK^T an fp8 dot (no K upcast); PV8: the
probabilities times the V scales quantized to fp8 (per-tile scale) and P@V an fp8 dot (no V
upcast); NOSCALE: per-token scales skipped (speed only). Upcasts use the kernels' PTX bit moves.
err: max abs difference to the real fp8 kernel with K upcast by bit moves (k_convert=False).
`--real`: only the real kernel, k_convert off and on (its default since 2026-12-04; the query
rounded to fp8 and an fp8 x fp8 QK dot in the session-11 measurements, which Triton lowers to
the same convert: see pdserve/kernels/_attention.py).
"""

from __future__ import annotations

import functools
import math
import sys

import torch
import triton
import triton.language as tl

from fp8_probe import report  # bench/ is on sys.path when run as a script
from pdserve.kernels._attention import fp8_bits_to_fp16_int, fp8_bits_to_fp16_ptx
from pdserve.kernels.decode_attention import decode_with_partitions
from pdserve.model.spec import ModelSpec
from pdserve.runtime.kv_quant import allocate_quant_pool, layer_views

HQ, HK, D, S = 32, 8, 128, 16


@triton.jit
def round_e4m3(x):
    """float32 x (|x| <= 448) rounded to the nearest fp8 e4m3 value (ties to even), as float32,
    by integer ops: Triton's interpreter rounds wrongly when a rounding carries into the next
    exponent (-127.9 -> -64). Normals keep 3 mantissa bits; below 2^-6 (e4m3's subnormals)
    the step is 2^-9, which adding and taking back 1.5 * 2^14 rounds to in float32."""
    u = x.to(tl.uint32, bitcast=True)
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    tiny = (x + 24576.0) - 24576.0
    return tl.where(tl.abs(x) < 0.015625, tiny, normal)


@triton.jit
def _kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_cn, stride_cs, stride_ch, stride_bt, stride_sn, stride_ss, stride_sh,
    scale_log2, G: tl.constexpr, G_PAD: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
    BLOCK_N: tl.constexpr, QK8: tl.constexpr, PV8: tl.constexpr, NOSCALE: tl.constexpr,
    VCVT: tl.constexpr = 2,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    heads = kvh * G + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=(g < G)[:, None], other=0.0)
    q = q.to(tl.float32)
    qs = tl.maximum(tl.max(tl.abs(q), 1), 1e-6) / 448.0
    if QK8:
        q = (q / qs[:, None]).to(tl.float8e4nv)
        qgain = qs * scale_log2
    else:
        q = q.to(tl.float16)
        qgain = tl.full([G_PAD], 256.0, tl.float32) * scale_log2
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    head_off = kvh * stride_ch + d
    for t0 in range(0, seq_len, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        page = tl.load(bt_row + t // S).to(tl.int64)
        slot = (t % S).to(tl.int64)
        tok_off = page * stride_cn + slot * stride_cs
        sc_off = page * stride_sn + slot * stride_ss + kvh * stride_sh
        k = tl.load(kc_ptr + tok_off[None, :] + head_off[:, None])
        if not QK8:
            k = fp8_bits_to_fp16_ptx(k)
        s = tl.dot(q, k) * qgain[:, None]
        if not NOSCALE:
            s = s * tl.load(ks_ptr + sc_off)[None, :]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + tok_off[:, None] + head_off[None, :])
        if NOSCALE:
            vs = tl.full([BLOCK_N], 1.0, tl.float32)
        else:
            vs = tl.load(vs_ptr + sc_off)
        if PV8:
            c = 256.0 / tl.max(vs, 0)
            pv = tl.dot((p * (vs * c)[None, :]).to(tl.float8e4nv), v) / c
        else:
            if VCVT == 2:
                pv = tl.dot((p * (vs * 256.0)[None, :]).to(tl.float16), fp8_bits_to_fp16_ptx(v))
            else:  # Triton's own convert (cvt.rn.f16x2.e4m3x2): true values, no 2^-8
                pv = tl.dot((p * vs[None, :]).to(tl.float16), v.to(tl.float16))
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=(g < G)[:, None])


@triton.jit
def _bd_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_cn, stride_cs, stride_ch, stride_bt, stride_sn, stride_ss, stride_sh,
    scale_log2, G: tl.constexpr, J: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Block-diagonal query: the G heads' rows repeat J times (R = G * J = 16 dot rows, all
    real), row block j dotting only the j-th run of BLOCK_N / J keys of a tile. So the scores
    are [16, BLOCK_N / J] (J times fewer softmax elements than [16, BLOCK_N] of which only G rows
    are real), each row an online-softmax stream of its own, merged per head at the end."""
    R: tl.constexpr = G * J
    TN: tl.constexpr = BLOCK_N // J
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)
    r = tl.arange(0, R)
    c = tl.arange(0, J * D)
    rg = r % G
    rj = r // G
    qmask = (c // D)[None, :] == rj[:, None]
    q = tl.load(q_ptr + b * stride_qb + (kvh * G + rg)[:, None] * stride_qh + (c % D)[None, :], mask=qmask,
                other=0.0).to(tl.float32)
    gain = tl.maximum(tl.max(tl.abs(q), 1), 1e-12) / 448.0
    q8 = (q / gain[:, None]).to(tl.float8e4nv)
    qg = gain * scale_log2
    m_i = tl.full([R], float("-inf"), tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, D], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    jj = tl.arange(0, J)
    nn = tl.arange(0, TN)
    d = tl.arange(0, D)
    head_off = kvh * stride_ch + d
    for t0 in range(0, seq_len, BLOCK_N):
        t2 = t0 + jj[:, None] * TN + nn[None, :]
        page = tl.load(bt_row + t2 // S).to(tl.int64)
        slot = (t2 % S).to(tl.int64)
        tok = page * stride_cn + slot * stride_cs
        sc = page * stride_sn + slot * stride_ss + kvh * stride_sh
        k = tl.load(kc_ptr + tok[:, None, :] + head_off[None, :, None])
        s = tl.dot(q8, tl.reshape(k, (J * D, TN)))
        ks = tl.reshape(tl.broadcast_to(tl.load(ks_ptr + sc)[:, None, :], (J, G, TN)), (R, TN))
        s = s * ks * qg[:, None]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vs = tl.reshape(tl.broadcast_to(tl.load(vs_ptr + sc)[:, None, :], (J, G, TN)), (R, TN))
        p = p * (vs * 256.0)
        pw = tl.where(jj[None, :, None] == rj[:, None, None], p[:, None, :], 0.0)
        pw = tl.reshape(pw, (R, J * TN)).to(tl.float16)
        v = tl.load(vc_ptr + tl.reshape(tok, (J * TN,))[:, None] + head_off[None, :])
        acc = acc * alpha[:, None] + tl.dot(pw, fp8_bits_to_fp16_ptx(v))
        m_i = m_new
    m3 = tl.reshape(m_i, (J, G))
    w = tl.exp2(m3 - tl.max(m3, 0)[None, :])
    den = tl.sum(tl.reshape(l_i, (J, G)) * w, 0)
    o = tl.sum(tl.reshape(acc, (J, G, D)) * w[:, :, None], 0) / den[:, None]
    g = tl.arange(0, G)
    tl.store(out_ptr + b * stride_qb + (kvh * G + g)[:, None] * stride_qh + d[None, :], o.to(out_ptr.dtype.element_ty))


@triton.jit
def _mh_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_cn, stride_cs, stride_bt, stride_sn, stride_ss, stride_sh,
    scale_log2, G: tl.constexpr, H: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    INTERP: tl.constexpr,
):
    """H KV heads per program (their K/V rows are contiguous: one [H*D, N] tile): the query is
    block-diagonal over the heads (row r = head r // G's query head r % G, zero outside its
    head's D columns), so QK^T gives [G*H, N] scores with every row real and one softmax for
    all H heads; P @ [N, H*D] V computes every head's rows against every head's V, and the
    diagonal blocks are kept at the end. Needs sequences of whole tiles (a probe)."""
    R: tl.constexpr = G * H
    hg = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(lens_ptr + b)
    r = tl.arange(0, R)
    c = tl.arange(0, H * D)
    rh = r // G
    q = tl.load(q_ptr + b * stride_qb + (hg * R + r)[:, None] * stride_qh + (c % D)[None, :],
                mask=(c // D)[None, :] == rh[:, None], other=0.0).to(tl.float32)
    gain = tl.maximum(tl.max(tl.abs(q), 1), 1e-12) / 448.0
    if INTERP:
        q8 = round_e4m3(q / gain[:, None])
    else:
        q8 = (q / gain[:, None]).to(tl.float8e4nv)
    qg = gain * scale_log2
    m_i = tl.full([R], float("-inf"), tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, H * D], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    head_off = hg * (H * D) + c  # heads contiguous in a token's row
    sc_head = (hg * H + rh) * stride_sh
    for t0 in range(0, seq_len, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        page = tl.load(bt_row + t // S).to(tl.int64)
        slot = (t % S).to(tl.int64)
        tok = page * stride_cn + slot * stride_cs
        sc = (page * stride_sn + slot * stride_ss)[None, :] + sc_head[:, None]
        k = tl.load(kc_ptr + tok[None, :] + head_off[:, None])
        if INTERP:
            s = tl.dot(q8, fp8_bits_to_fp16_int(k).to(tl.float32), input_precision="ieee") * 256.0
        else:
            s = tl.dot(q8, k)
        s = s * tl.load(ks_ptr + sc) * qg[:, None]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p * (tl.load(vs_ptr + sc) * 256.0)
        v = tl.load(vc_ptr + tok[:, None] + head_off[None, :])
        if INTERP:
            pv = tl.dot(p, fp8_bits_to_fp16_int(v).to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(tl.float16), fp8_bits_to_fp16_ptx(v))
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    o = tl.reshape(acc / l_i[:, None], (R, H, D))
    o = tl.sum(tl.where(tl.arange(0, H)[None, :, None] == rh[:, None, None], o, 0.0), 1)
    tl.store(out_ptr + b * stride_qb + (hg * R + r)[:, None] * stride_qh + tl.arange(0, D)[None, :],
             o.to(out_ptr.dtype.element_ty))


def probe_mh(q, kc, vc, ks, vs, tables, lens, scale, *, heads=4, block_n=64, warps=8, stages=2, maxnreg=None,
             interp=False):
    hk, d = kc.shape[2], kc.shape[3]
    g = q.shape[1] // hk
    assert kc.stride(2) == d and hk % heads == 0 and g * heads >= 16 or interp
    out = torch.empty_like(q)
    _mh_kernel[(hk // heads, q.shape[0])](
        q, kc, vc, ks, vs, tables, lens, out,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), tables.stride(0),
        *ks.stride()[:3], scale * math.log2(math.e),
        G=g, H=heads, S=kc.shape[1], D=d, BLOCK_N=block_n, INTERP=interp,
        num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return out


def probe_bd(q, kc, vc, ks, vs, tables, lens, scale, *, block_n=128, warps=4, stages=2, maxnreg=128):
    out = torch.empty_like(q)
    _bd_kernel[(q.shape[0], HK)](
        q, kc, vc, ks, vs, tables, lens, out,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), tables.stride(0),
        *ks.stride()[:3], scale * math.log2(math.e),
        G=HQ // HK, J=16 // (HQ // HK), S=S, D=D, BLOCK_N=block_n,
        num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return out


@triton.jit
def _vt_kernel(
    q_ptr, kc_ptr, vt_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_cn, stride_cs, stride_ch, stride_vn, stride_vh, stride_bt,
    stride_sn, stride_ss, stride_sh, scale_log2,
    G: tl.constexpr, G_PAD: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    INTERP: tl.constexpr, Q8: tl.constexpr = True, P8: tl.constexpr = True,
):
    """Q8=False / P8=False: that dot in f16 instead, its fp8 operand converted by Triton
    (.to(float16)) and the other operand not rounded to fp8. Both dots in fp8, nothing upcast: the query rounded to fp8 for QK^T, and V read from a
    transposed copy of the cache (per page and head: D rows of S tokens) so that its tile is
    reduction-major, as an fp8 tensor-core operand must be; P (times the V scales, scaled per
    tile to e4m3's range) rounded to fp8 for P @ V. Sequences of whole tiles (a probe)."""
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    heads = kvh * G + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=(g < G)[:, None],
                other=0.0).to(tl.float32)
    gain = tl.maximum(tl.max(tl.abs(q), 1), 1e-12) / 448.0
    if not Q8:
        gain = tl.full([G_PAD], 448.0, tl.float32) / 448.0
        q8 = q.to(tl.float16)
    elif INTERP:
        q8 = round_e4m3(q / gain[:, None])
    else:
        q8 = (q / gain[:, None]).to(tl.float8e4nv)
    qg = gain * scale_log2
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    for t0 in range(0, seq_len, BLOCK_N):
        t = tl.multiple_of(t0, BLOCK_N) + tl.arange(0, BLOCK_N)
        page = tl.load(bt_row + t // S).to(tl.int64)
        slot = (t % S).to(tl.int64)
        sc = page * stride_sn + slot * stride_ss + kvh * stride_sh
        k = tl.load(kc_ptr + (page * stride_cn + slot * stride_cs)[None, :] + (kvh * stride_ch + d)[:, None])
        if INTERP:
            s = tl.dot(q8, fp8_bits_to_fp16_int(k).to(tl.float32), input_precision="ieee") * 256.0
        elif Q8:
            s = tl.dot(q8, k)
        else:
            s = tl.dot(q8, k.to(tl.float16))
        s = s * tl.load(ks_ptr + sc)[None, :] * qg[:, None]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vs = tl.load(vs_ptr + sc)
        c = 256.0 / tl.max(vs, 0)
        pv = p * (vs * c)[None, :]
        vt_off = tl.max_contiguous(tl.multiple_of(page * stride_vn + slot, S), S)
        vt = tl.load(vt_ptr + vt_off[None, :] + (kvh * stride_vh + d * S)[:, None])  # [D, N]
        if INTERP:
            o = tl.dot(round_e4m3(pv), tl.trans(fp8_bits_to_fp16_int(vt).to(tl.float32)), input_precision="ieee")
            o = o * 256.0
        elif P8:
            o = tl.dot(pv.to(tl.float8e4nv), tl.trans(vt))
        else:
            o = tl.dot(pv.to(tl.float16), tl.trans(vt).to(tl.float16))
        acc = acc * alpha[:, None] + o / c
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=(g < G)[:, None])


@triton.jit
def _vmode_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr,
        stride_qb, stride_qh, stride_cn, stride_cs, stride_ch, stride_bt, stride_sn, stride_ss, stride_sh,
        scale_log2, G: tl.constexpr, G_PAD: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
        VMODE: tl.constexpr):
    """K through Triton's convert (as the real kernel) and V by VMODE: 0 PTX bit moves (as the
    real kernel), 1 Triton's convert of the [N, D] tile, 2 the tile loaded [D, N] and transposed,
    3 o^T = V^T p^T (V^T the A operand), 4 converted before the dot. Whole tiles only (a probe);
    offline sm_90 SASS (Triton 3.6) has 1,299 / 1,061 / 1,113 / 1,004 instructions per iteration
    for modes 0-3, but mode 1 ran slower than 0 on the H200 (fp8-dot-probe log, vcvt=0)."""
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    heads = kvh * G + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=(g < G)[:, None], other=0.0).to(tl.float16)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    head_off = kvh * stride_ch + d
    for t0 in range(0, seq_len, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        page = tl.load(bt_row + t // S).to(tl.int64)
        slot = (t % S).to(tl.int64)
        tok = page * stride_cn + slot * stride_cs
        sc = page * stride_sn + slot * stride_ss + kvh * stride_sh
        k = tl.load(kc_ptr + tok[None, :] + head_off[:, None])
        s = tl.dot(q, k.to(tl.float16)) * (tl.load(ks_ptr + sc) * scale_log2)[None, :]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vs = tl.load(vs_ptr + sc)
        if VMODE == 0:  # PTX bit moves (the kernel)
            v = tl.load(vc_ptr + tok[:, None] + head_off[None, :])
            pv = tl.dot((p * (vs * 256.0)[None, :]).to(tl.float16), fp8_bits_to_fp16_ptx(v))
        elif VMODE == 1:  # Triton's convert on the [N, D] tile
            v = tl.load(vc_ptr + tok[:, None] + head_off[None, :])
            pv = tl.dot((p * vs[None, :]).to(tl.float16), v.to(tl.float16))
        elif VMODE == 2:  # loaded as [D, N], transposed in registers, Triton's convert
            vt = tl.load(vc_ptr + tok[None, :] + head_off[:, None])
            pv = tl.dot((p * vs[None, :]).to(tl.float16), tl.trans(vt).to(tl.float16))
        elif VMODE == 3:  # o^T = V^T p^T: V^T [D, N] as the A operand (reduction over N)
            vt = tl.load(vc_ptr + tok[None, :] + head_off[:, None])
            pv = tl.trans(tl.dot(vt.to(tl.float16), tl.trans((p * vs[None, :]).to(tl.float16))))
        else:  # converted to f16 first, then the dot (explicit)
            v = tl.load(vc_ptr + tok[:, None] + head_off[None, :]).to(tl.float16)
            pv = tl.dot((p * vs[None, :]).to(tl.float16), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], o.to(out_ptr.dtype.element_ty), mask=(g < G)[:, None])

def probe_vmode(q, kc, vc, ks, vs, tables, lens, scale, *, vmode=0, block_n=128, warps=4, stages=2):
    out = torch.empty_like(q)
    _vmode_kernel[(q.shape[0], HK)](
        q, kc, vc, ks, vs, tables, lens, out,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), tables.stride(0),
        *ks.stride()[:3], scale * math.log2(math.e),
        G=HQ // HK, G_PAD=16, S=S, D=D, BLOCK_N=block_n, VMODE=vmode, num_warps=warps, num_stages=stages)
    return out


def transposed_v(v: torch.Tensor) -> torch.Tensor:
    """The V values [N, S, Hk, D] as the V^T cache _vt_kernel reads: [N, Hk, D, S], contiguous."""
    return v.permute(0, 2, 3, 1).contiguous()


def probe_vt(q, kc, vt, ks, vs, tables, lens, scale, *, block_n=128, warps=4, stages=2, maxnreg=None,
             interp=False, q8=True, p8=True):
    hk, d, s_ = kc.shape[2], kc.shape[3], kc.shape[1]
    out = torch.empty_like(q)
    _vt_kernel[(q.shape[0], hk)](
        q, kc, vt, ks, vs, tables, lens, out,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), vt.stride(0), vt.stride(1),
        tables.stride(0), *ks.stride()[:3], scale * math.log2(math.e),
        G=q.shape[1] // hk, G_PAD=max(16, q.shape[1] // hk), S=s_, D=d, BLOCK_N=block_n, INTERP=interp, Q8=q8, P8=p8,
        num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return out


def probe(q, kc, vc, ks, vs, tables, lens, scale, *, qk8=False, pv8=False, noscale=False, block_n=128,
          warps=4, stages=2, maxnreg=128, vcvt=2) -> torch.Tensor:
    out = torch.empty_like(q)
    _kernel[(q.shape[0], HK)](
        q, kc, vc, ks, vs, tables, lens, out,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), tables.stride(0),
        *ks.stride()[:3], scale * math.log2(math.e),
        G=HQ // HK, G_PAD=16, S=S, D=D, BLOCK_N=block_n, QK8=qk8, PV8=pv8, NOSCALE=noscale, VCVT=vcvt,
        num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return out


def main() -> None:
    spec = ModelSpec.from_config_dict({
        "model_type": "llama", "hidden_size": HQ * D, "intermediate_size": 256, "num_hidden_layers": 1,
        "num_attention_heads": HQ, "num_key_value_heads": HK, "vocab_size": 256})
    scale = D ** -0.5
    seqs, ctx = 256, 4096
    need = ctx // S
    pool = allocate_quant_pool(spec, seqs * need, S, "fp8_e4m3", "cuda")
    views = layer_views(pool, 0, D)
    for t in (views.k, views.v):
        t.view(torch.uint8).copy_((torch.randn(t.shape, device="cuda") * 0.5).to(torch.float8_e4m3fn).view(torch.uint8))
    views.k_scale.uniform_(0.05, 0.2)
    views.v_scale.uniform_(0.005, 0.02)
    tables = torch.randperm(seqs * need, device="cuda", dtype=torch.int32).view(seqs, need)
    lens = torch.full((seqs,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(seqs, HQ, D, device="cuda", dtype=torch.bfloat16)
    nbytes = seqs * ctx * HK * 2 * (D + 4)
    args = (q, views.k, views.v, tables, lens, scale, ctx, views.k_scale, views.v_scale)
    ref = decode_with_partitions(*args, k_convert=False)  # K upcast by bit moves
    print(f"mean |out| {ref.float().abs().mean().item():.3e}", flush=True)
    if "--vt" in sys.argv:  # the real kernel once, then both dots in fp8 over a V^T copy
        vt = transposed_v(views.v)
        report("real fp8 kernel", functools.partial(decode_with_partitions, *args), ref, nbytes)
        for kw in (dict(), dict(p8=False), dict(q8=False, p8=False), dict(q8=False), dict(maxnreg=128),
                   dict(block_n=64), dict(block_n=256, warps=8), dict(stages=3), dict(p8=False, stages=3)):
            report(f"V^T fp8-dots probe {kw}", functools.partial(
                probe_vt, q, views.k, vt, views.k_scale, views.v_scale, tables, lens, scale, **kw), ref, nbytes)
        return
    if "--vmode" in sys.argv:  # the real kernel once, then ways to get V into the P @ V dot
        report("real fp8 kernel", functools.partial(decode_with_partitions, *args), ref, nbytes)
        for kw in (dict(vmode=0), dict(vmode=1), dict(vmode=2), dict(vmode=3), dict(vmode=4), dict(vmode=3, stages=3)):
            report(f"V-mode probe {kw}", functools.partial(
                probe_vmode, q, views.k, views.v, views.k_scale, views.v_scale, tables, lens, scale, **kw), ref, nbytes)
        return
    if "--mh" in sys.argv:  # the real kernel once, then H KV heads per program
        report("real fp8 kernel", functools.partial(decode_with_partitions, *args), ref, nbytes)
        for kw in (dict(), dict(block_n=32), dict(warps=4), dict(warps=4, block_n=32), dict(block_n=128),
                   dict(stages=3)):
            report(f"multi-head probe {kw}", functools.partial(
                probe_mh, q, views.k, views.v, views.k_scale, views.v_scale, tables, lens, scale, **kw), ref, nbytes)
        return
    for k_convert in (False, True, False, True):
        report(f"real fp8 kernel k_convert={k_convert}", functools.partial(decode_with_partitions, *args,
                                                                          k_convert=k_convert), ref, nbytes)
    if "--real" in sys.argv:
        return
    run = lambda **kw: probe(q, views.k, views.v, views.k_scale, views.v_scale, tables, lens, scale, **kw)  # noqa: E731
    if "--vcvt" in sys.argv:
        for kw in (dict(qk8=True), dict(qk8=True, vcvt=0), dict(qk8=True, vcvt=0, stages=3),
                   dict(qk8=True, vcvt=0, maxnreg=None), dict(qk8=True), dict(qk8=True, vcvt=0)):
            report(f"probe {kw}", functools.partial(run, **kw), ref, nbytes)
        return
    if "--bd" in sys.argv:
        for kw in (dict(), dict(block_n=256), dict(block_n=256, warps=8), dict(maxnreg=None), dict(stages=3),
                   dict(block_n=64)):
            report(f"block-diagonal probe {kw}", functools.partial(
                probe_bd, q, views.k, views.v, views.k_scale, views.v_scale, tables, lens, scale, **kw), ref, nbytes)
        for kw in (dict(block_n=64), dict(block_n=256, num_warps=8), dict(max_registers=96), dict(max_registers=160),
                   dict(max_registers=None), dict(num_stages=3), dict(num_stages=3, max_registers=None)):
            report(f"real fp8 kernel {kw}", functools.partial(decode_with_partitions, *args, **kw), ref, nbytes)
        return
    for kw in (dict(), dict(stages=3), dict(qk8=True), dict(pv8=True), dict(qk8=True, pv8=True),
               dict(qk8=True, pv8=True, stages=3), dict(qk8=True, pv8=True, maxnreg=None),
               dict(qk8=True, pv8=True, block_n=64), dict(qk8=True, pv8=True, block_n=256, warps=8),
               dict(qk8=True, noscale=True), dict(qk8=True, pv8=True, noscale=True), dict()):
        report(f"probe {kw}", functools.partial(run, **kw), ref, nbytes)


if __name__ == "__main__":
    main()
