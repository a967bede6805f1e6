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
                  S: tl.constexpr, QUANT: tl.constexpr, MASK_T: tl.constexpr = 1, last_page=0,
                  OFF32: tl.constexpr = False):
    """Element offsets (int64; int32 if OFF32, which the caller must know to be safe: see
    decode_attention.offsets_fit_int32) of tokens t of one sequence inside a paged cache view,
    and of their float32 scales (KV head kvh) when QUANT (else the same offsets); one table
    lookup. MASK_T (see attend_tile) 0: every t is a token of the sequence; 1: tokens outside
    tmask get page 0; 2: their page index is capped at last_page, so they read the sequence's
    last page again (allocated memory, never stored to) without a load mask."""
    if MASK_T == 2:
        page = tl.load(bt_row + tl.minimum(t // S, last_page))
    else:
        page = _ld(bt_row + t // S, tmask, MASK_T == 1)
    slot = t % S
    if not OFF32:
        page = page.to(tl.int64)
        slot = slot.to(tl.int64)
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
    return _e4m3_fields(x.to(tl.uint8, bitcast=True).to(tl.uint16))


@triton.jit
def _e4m3_fields(u):
    """fp8_bits_to_fp16_int of e4m3 bytes held in uint16 u (< 256)."""
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
def e4m3_pairs(x, DOT_F32: tl.constexpr):
    """uint16 pairs of e4m3 bytes (little-endian: the low byte is the even element) -> (the low
    bytes, the high bytes) as fp16, exactly: per pair of pairs (one 32-bit register), a byte
    permute that puts both low bytes side by side, then the hardware convert
    (cvt.rn.f16x2.e4m3x2) of each half. Each output element depends on its own
    input element only, so Triton may place it in any layout (it runs it after the 16-bit
    tile's ldmatrix, in the dot operand's layout). NaN codes become NaN, as the hardware
    makes them. The interpreter moves the fields with integer ops (fp32 out, exact: see
    fp8_bits_to_fp16_int)."""
    if DOT_F32:
        u = x.to(tl.uint16, bitcast=True)
        lo, hi = u & 0xFF, u >> 8
        lo_f = tl.where((lo & 0x7F) == 0x7F, float("nan"), _e4m3_fields(lo).to(tl.float32) * 256.0)
        hi_f = tl.where((hi & 0x7F) == 0x7F, float("nan"), _e4m3_fields(hi).to(tl.float32) * 256.0)
        return lo_f, hi_f
    else:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b16 l, h;
            .reg .b32 t;
            prmt.b32 t, $2, 0, 0x3120;
            mov.b32 {l, h}, t;
            cvt.rn.f16x2.e4m3x2 $0, l;
            cvt.rn.f16x2.e4m3x2 $1, h;
            }""",
            constraints="=r,=r,r", args=[x], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def int8_pairs(x, DOT_F32: tl.constexpr):
    """e4m3_pairs for uint16 pairs of int8 bytes, exactly: per 32-bit register, flip the sign
    bits (b + 128 as unsigned), two byte permutes that put 0x64 above each low (high) byte,
    which reads as the fp16 1024 + (b + 128), and two packed subtractions of 1152 (there is no
    packed int8 -> f16 convert). The interpreter does the same bit moves one element at a time."""
    if DOT_F32:
        u = x.to(tl.uint16, bitcast=True)
        return _biased_int8(u & 0xFF), _biased_int8(u >> 8)
    else:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t, a, b, c;
            xor.b32 t, $2, 0x80808080;
            prmt.b32 a, t, 0x64646464, 0x4240;
            prmt.b32 b, t, 0x64646464, 0x4341;
            mov.b32 c, 0x64806480;
            sub.rn.f16x2 $0, a, c;
            sub.rn.f16x2 $1, b, c;
            }""",
            constraints="=r,=r,r", args=[x], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def _biased_int8(u):
    """An int8 byte held in uint16 u (< 256) as int8_pairs computes it, in fp32."""
    return (((u ^ 0x80) | 0x6400).to(tl.float16, bitcast=True) - 1152.0).to(tl.float32)


@triton.jit
def byte_pairs(x, INT8: tl.constexpr, DOT_F32: tl.constexpr):
    """int8_pairs if INT8, else e4m3_pairs."""
    if INT8:
        return int8_pairs(x, DOT_F32)
    else:
        return e4m3_pairs(x, DOT_F32)


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
def online_softmax(s, m_i, l_i):
    """One step of the online softmax over scores s [M, N] (log2 domain): the new running max,
    the factor that rescales what was accumulated so far, the tile's probabilities and the new
    running denominator."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, 1)


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
    m_new, alpha, p, l_i = online_softmax(s, m_i, l_i)
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


@triton.jit
def pair_pv_gain(INT8: tl.constexpr):
    """How many times too large attend_pairs' P V products are: P times the V scales is rounded to
    fp16 scaled up, so small probabilities stay normal, within the range of the values (int8
    values reach 127 against e4m3's 448, and their scales are absmax / 127: a gain of 256 would
    overflow fp16 from V values of 32k up, 16 only from 520k; e4m3 with 256 from 114k)."""
    if INT8:
        return 16.0
    else:
        return 256.0


@triton.jit
def attend_pairs(
    qe, qo, kc2, vc2, tok_off, head_off, dmask, tmask, m_i, l_i, acc_e, acc_o, scale_log2,
    PRECISION: tl.constexpr, DOT_F32: tl.constexpr, ks_ptr, vs_ptr, sc_off, MASK_T: tl.constexpr,
    MASK_D: tl.constexpr, INT8: tl.constexpr = False,
):
    """attend_tile (quantized) over an fp8 e4m3 (int8 if INT8) cache read as 16-bit pairs of
    bytes (split by byte_pairs): kc2/vc2 are the caches' pointers as uint16, tok_off/head_off
    offsets in pairs, dmask which pairs are inside the head. The head dim is split in even and
    odd elements: scores are qe @ K_even + qo @ K_odd, and acc_e/acc_o [M, D/2] accumulate
    P @ V_even and P @ V_odd, pair_pv_gain(INT8) times too large (the caller divides).
    MASK_T 0: every token is valid; 1: loads masked by tmask (zeros: the hardware convert
    turns NaN codes into NaN, which a zero probability would not cancel in P @ V, so
    attend_tile's unmasked MASK_T 2 is not offered). Why: 16-bit tiles
    move from shared memory into the dot operands by ldmatrix, as bf16 ones do, and split
    into fp16 with the hardware convert (see e4m3_pairs), where a byte tile goes through
    byte loads and permutes (sm_90 SASS of the decode kernel's main loop per 128-token tile:
    718 instructions against 1,350 through attend_tile; 588 with 32-bit offsets;
    bench/sass_offline.py). On an H100 at 256 x 4k the kernel's compute floor (pages in L2)
    fell from 0.636 to 0.379 ms (bench/pair_probe.py, pair-probe-h100-2026-12-07-s22a-256.json).
    The prefill kernel keeps byte tiles: compiled offline with pairs (sm_90, warpgroup MMAs) its
    loop took more instructions per 64-token tile (1,561 against 1,383), Triton loading one of
    the 16-bit tiles with scalar loads outside the pipeline (tried 2026-12-07, not kept)."""
    if MASK_T == 1:
        ld_k, ld_v = dmask[:, None] & tmask[None, :], tmask[:, None] & dmask[None, :]
    else:
        ld_k, ld_v = dmask[:, None], dmask[None, :]
    masked: tl.constexpr = (MASK_T == 1) or MASK_D
    ke, ko = byte_pairs(_ld(kc2 + tok_off[None, :] + head_off[:, None], ld_k, masked), INT8, DOT_F32)
    s = mm(qe, ke, PRECISION, DOT_F32) + mm(qo, ko, PRECISION, DOT_F32)
    s = s * (_ld(ks_ptr + sc_off, tmask, MASK_T == 1) * scale_log2)[None, :]
    if MASK_T == 1:
        s = tl.where(tmask[None, :], s, float("-inf"))
    m_new, alpha, p, l_i = online_softmax(s, m_i, l_i)
    pv = p * (_ld(vs_ptr + sc_off, tmask, MASK_T == 1) * pair_pv_gain(INT8))[None, :]
    if not DOT_F32:
        pv = pv.to(tl.float16)
    ve, vo = byte_pairs(_ld(vc2 + tok_off[:, None] + head_off[None, :], ld_v, masked), INT8, DOT_F32)
    acc_e = acc_e * alpha[:, None] + mm(pv, ve, PRECISION, DOT_F32)
    acc_o = acc_o * alpha[:, None] + mm(pv, vo, PRECISION, DOT_F32)
    return m_new, l_i, acc_e, acc_o
