"""Triton building blocks shared by the paged attention kernels.

Both kernels walk a sequence's KV in tiles of BLOCK_N tokens; a tile may span several cache
blocks (pages), so each token's page is looked up in the block table, which also lets the
tile size differ from the cache block size.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _ld(ptr, mask, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptr, mask=mask, other=0.0)
    else:
        return tl.load(ptr)


@triton.jit
def paged_offsets(bt_row, t, tmask, stride_cn, stride_cs, kvh, stride_sn, stride_ss, stride_sh,
                  S: tl.constexpr, QUANT: tl.constexpr, MASK_T: tl.constexpr = 1, last_page=0):
    """Element offsets (int64) of tokens t of one sequence inside a paged cache view, and of
    their float32 scales (KV head kvh) when QUANT (else the same offsets); one table lookup.
    MASK_T (see attend_tile) 0: every t is a token of the sequence; 1: tokens outside tmask
    get page 0; 2: their page index is capped at last_page, so they read the sequence's last
    page again (allocated memory, never stored to) without a load mask."""
    if MASK_T == 2:
        page = tl.load(bt_row + tl.minimum(t // S, last_page)).to(tl.int64)
    else:
        page = _ld(bt_row + t // S, tmask, MASK_T == 1).to(tl.int64)
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
def fp8_bits_to_fp16_int(x):
    """fp8 e4m3 bits -> fp16 by moving the fields (sign; exponent and mantissa one bit right):
    fp16's exponent bias (15) exceeds e4m3's (7) by 8, so every value, subnormals included,
    comes out exactly 2^-8 of the true one (upcast_gain undoes it); NaN codes become finite,
    but quantized writes never store them. Integer ops, one element at a time (what the
    interpreter runs); fp8_bits_to_fp16_ptx is the same on GPUs."""
    u = x.to(tl.uint8, bitcast=True).to(tl.uint16)
    return (((u & 0x80) << 8) | ((u & 0x7F) << 7)).to(tl.float16, bitcast=True)


@triton.jit
def fp8_bits_to_fp16_ptx(x):
    """fp8_bits_to_fp16_int in PTX on four bytes at a time (prmt/shr/and/or): cheaper than
    Triton's convert (cvt.f16x2.e4m3x2) on an H200 (bench/fp8_probe.py)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a, b, t;
        prmt.b32 a, $2, 0, 0x1404;
        prmt.b32 b, $2, 0, 0x3424;
        shr.b32 t, a, 1;
        and.b32 t, t, 0x3F803F80;
        and.b32 a, a, 0x80008000;
        or.b32 $0, a, t;
        shr.b32 t, b, 1;
        and.b32 t, t, 0x3F803F80;
        and.b32 b, b, 0x80008000;
        or.b32 $1, b, t;
        }""",
        constraints="=r,=r,r", args=[x.to(tl.uint8, bitcast=True)], dtype=tl.float16,
        is_pure=True, pack=4)


@triton.jit
def upcast(x, qtype, DOT_F32: tl.constexpr):
    """A quantized K/V tile as the dots take it, times upcast_gain(x) (fp8 only: see
    fp8_bits_to_fp16_int). The interpreter, which runs no PTX, does the field moves with
    integer ops (so CPU tests check the math) and dots in fp32 (see mm)."""
    if x.dtype == tl.float8e4nv:
        if DOT_F32:
            y = fp8_bits_to_fp16_int(x).to(tl.float32)
        else:
            y = fp8_bits_to_fp16_ptx(x)
            if qtype != tl.float16:
                y = y.to(qtype)  # fp32 queries: exact
    else:
        # the interpreter mis-converts int8 -> bf16; it upcasts to fp32 anyway (DOT_F32)
        y = x.to(tl.float32) if DOT_F32 else x.to(qtype)
    return y


@triton.jit
def upcast_gain(x):
    """What upcast's values must be multiplied by (a power of two: exact)."""
    if x.dtype == tl.float8e4nv:
        return 256.0
    else:
        return 1.0


@triton.jit
def attend_tile(
    q, kc_ptr, vc_ptr, tok_off, head_off, dmask, tmask, valid,
    m_i, l_i, acc, scale_log2, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
    ks_ptr, vs_ptr, sc_off, QUANT: tl.constexpr, MASK_T: tl.constexpr, MASK_D: tl.constexpr,
    K_CVT: tl.constexpr = False,
):
    """One online-softmax step of rows q [M, D] over a KV tile (log2 domain, fp32 state).

    tok_off [N]: token offsets from kv_token_offsets; head_off [D]: head * row + d;
    valid [M, N]: which (row, key) pairs attend. Every row must see at least one valid key
    in the first tile it processes, so the running max is finite from then on.
    MASK_T 0: every token of the tile is valid (tmask and valid are ignored); 1: loads are
    masked by tmask and scores by valid; 2 (quantized caches only, offsets from paged_offsets
    with MASK_T 2): loads are unmasked, scores masked by valid and V scales by tmask, which is
    safe because a quantized tile upcasts to finite values whatever its bytes (see upcast).
    MASK_D=False: dmask is all true. Unmasked loads are cheaper (bench/fp8_probe.py).
    QUANT: K/V are fp8/int8 with per-token scales at ks_ptr/vs_ptr + sc_off [N]; the K scale
    multiplies score columns and the V scale the probabilities, so tiles are only upcast
    (exactly, see upcast) and no dequantized copy is ever written.
    K_CVT (fp8 caches, fp16 queries, GPUs): the K tile goes into the score dot through Triton's
    own convert (k.to(float16)), which Triton 3.6 places after the tile's shared-memory load, in
    the dot operand's layout: one hardware e4m3->f16 instruction per two values (F2FP), where
    upcast's PTX bit moves cost about five and made a third of the kernel's instructions
    (bench/results/ncu-sass-h200-2026-12-04-s11.log). The V tile, whose reduction dim (tokens)
    is not its contiguous one, keeps upcast: Triton's convert placed there was slower
    (bench/results/fp8-dot-probe-h200-2026-12-04-s11.log).
    """
    if (MASK_T == 1) and MASK_D:
        kmask = dmask[:, None] & tmask[None, :]
    elif (MASK_T == 1):
        kmask = tmask[None, :]
    else:
        kmask = dmask[:, None]
    k = _ld(kc_ptr + tok_off[None, :] + head_off[:, None], kmask, (MASK_T == 1) or MASK_D)
    if QUANT:
        if K_CVT and not DOT_F32:
            k_gain = 1.0
            s = mm(q, k.to(tl.float16), PRECISION, DOT_F32)
        else:
            k_gain = upcast_gain(k)
            s = mm(q, upcast(k, q.dtype, DOT_F32), PRECISION, DOT_F32)
        s = s * (_ld(ks_ptr + sc_off, tmask, (MASK_T == 1)) * (scale_log2 * k_gain))[None, :]
    else:
        s = mm(q, k, PRECISION, DOT_F32) * scale_log2
    if MASK_T != 0:
        s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if (MASK_T == 1) and MASK_D:
        vmask = tmask[:, None] & dmask[None, :]
    elif (MASK_T == 1):
        vmask = tmask[:, None]
    else:
        vmask = dmask[None, :]
    v = _ld(vc_ptr + tok_off[:, None] + head_off[None, :], vmask, (MASK_T == 1) or MASK_D)
    pv = p
    if QUANT:
        v_gain = upcast_gain(v)
        v = upcast(v, q.dtype, DOT_F32)
        vs = _ld(vs_ptr + sc_off, tmask, (MASK_T == 1))
        if MASK_T == 2:
            vs = tl.where(tmask, vs, 0.0)  # p is 0 there, but a stray scale may be inf/NaN
        pv = p * (vs * v_gain)[None, :]
    acc = acc * alpha[:, None] + mm(pv.to(v.dtype), v, PRECISION, DOT_F32)
    return m_new, l_i, acc


KV_MAJOR_GAIN = tl.constexpr(256.0)


@triton.jit
def round_e4m3(x):
    """x (|x| <= 448, fp32) rounded to the nearest fp8 e4m3 value, kept in fp32 (ties away
    from zero). For the interpreter, whose fp32 -> fp8 convert is wrong; GPUs use the
    hardware's (round to nearest even)."""
    a = tl.abs(x)
    step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), -6.0) - 3.0)
    r = tl.floor(a / step + 0.5) * step
    return tl.where(x < 0, -r, r)


@triton.jit
def _to_e4m3(x, DOT_F32: tl.constexpr):
    """x rounded to fp8 e4m3: fp8 on GPUs, fp32 holding the same value under DOT_F32."""
    if DOT_F32:
        return round_e4m3(x)
    else:
        return x.to(tl.float8e4nv)


@triton.jit
def split_query_fp8(q, scale_log2, DOT_F32: tl.constexpr):
    """Rows q [G, D] as three fp8 e4m3 parts for kv-major score dots: q = (hi + mid + lo) * r
    per row, r = amax / 448, mid the rounding error of hi and lo that of hi + mid. Each part
    keeps 4 significant bits down to e4m3's subnormal step (2^-9, i.e. 2^-17.8 of the row's
    largest element), so the sum is within ~2^-12 of the row's largest element (fp16 rounds
    to 2^-11 of each element; two parts reach only ~2^-8, too coarse for queries that make
    softmax sharp). Returns the parts transposed ([D, G], the dots' B operand) and
    r * scale_log2 [G]. DOT_F32: fp32 tensors holding the same values (the interpreter's fp8
    convert is wrong)."""
    qf = q.to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(qf), 1), 1e-30)
    qs = qf * (448.0 / amax)[:, None]
    hi = _to_e4m3(qs, DOT_F32)
    r = qs - hi.to(tl.float32)
    mid = _to_e4m3(r, DOT_F32)
    lo = _to_e4m3(r - mid.to(tl.float32), DOT_F32)
    return tl.trans(hi), tl.trans(mid), tl.trans(lo), amax * (scale_log2 / 448.0)


@triton.jit
def attend_tile_kv_major(
    qt_hi, qt_mid, qt_lo, q_factor, kc_ptr, vc_ptr, tok_off, head_off, tmask, m_i, l_t, acc_t,
    ks_ptr, vs_ptr, sc_off, DOT_F32: tl.constexpr, Q_PARTS: tl.constexpr = 3,
):
    """attend_tile (MASK_T 2, whole head dim, fp8 e4m3 cache) with the tile's tokens as the
    dots' M dimension: scores S^T [N, G] = K [N, D] @ Q^T [D, G] and acc_t [D, G] += V^T [D, N]
    @ P^T [N, G] * KV_MAJOR_GAIN (divide it out at the end). On Hopper the score dots are
    warpgroup MMAs (M = 64 per warpgroup) that read the fp8 K tile from shared memory as it is,
    with the query split by split_query_fp8 (three chained dots), so no K element is converted;
    V is upcast to fp16 for the second dot, which reads it transposed from shared memory.
    l_t [N, G] keeps the softmax denominators per token row (sum it over rows after the last
    tile): the tokens are spread over the warps, so a per-tile sum would cost a cross-warp
    reduction (the max needs one). sm_90 SASS per 128-token tile: 1,005 instructions against
    1,350 for attend_tile's form (bench/sass_offline.py). Returns (m [G], l_t, acc_t)."""
    k = tl.load(kc_ptr + tok_off[:, None] + head_off[None, :])
    if DOT_F32:
        kf = k.to(tl.float32)
        s = tl.dot(kf, qt_mid, tl.dot(kf, qt_hi, input_precision="ieee"), input_precision="ieee")
        if Q_PARTS == 3:
            s = tl.dot(kf, qt_lo, s, input_precision="ieee")
    else:  # one accumulator: the warpgroup MMAs chain
        s = tl.dot(k, qt_mid, tl.dot(k, qt_hi))
        if Q_PARTS == 3:
            s = tl.dot(k, qt_lo, s)
    s = s * tl.load(ks_ptr + sc_off)[:, None] * q_factor[None, :]
    s = tl.where(tmask[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[None, :])
    l_t = l_t * alpha[None, :] + p
    vs = tl.where(tmask, tl.load(vs_ptr + sc_off), 0.0)  # p is 0 there, a stray scale may be NaN
    v = tl.load(vc_ptr + tok_off[:, None] + head_off[None, :])
    pv = p * (vs * KV_MAJOR_GAIN)[:, None]  # fp16 P keeps its precision where vs is tiny
    if DOT_F32:
        acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v.to(tl.float32)), pv, input_precision="ieee")
    else:
        acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v.to(tl.float16)), pv.to(tl.float16))
    return m_new, l_t, acc_t
