"""Paged decode attention with GQA and split-K (Triton twin of reference.paged_decode_attention).

One program handles every query head of one KV head group over one partition of one
sequence's context (flash-decoding): the K/V tile is loaded once for the whole group, and a
long context is cut into partitions computed in parallel, so a few long sequences still fill
the GPU. A second small kernel merges the partitions by their log-sum-exp. The partition
count comes from the block table's width (no host sync, CUDA-graph friendly) and each sequence
spreads over the partitions evenly in whole tiles, so a table wider than needed costs empty
programs and a longer merge, not unbalanced work. Tiles wholly inside a sequence are read
without load masks (see `tiles`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pdserve.kernels._attention import attend_pairs, attend_tile, paged_offsets, pair_pv_gain, query_for
from pdserve.kernels._common import check_attention_inputs, check_device, check_dim, check_dtype
from pdserve.kernels._common import check_scales
from pdserve.kernels._common import dot_precision, interpreting, next_pow2, num_sms
from pdserve.kernels.reference import QUANT_MAX
from pdserve.kernels.rotary import rotated_heads
from pdserve.kernels.write_kv import slot_offsets, store_row, token_rows

_MIN_PARTITION = 256


@dataclass(frozen=True)
class RopeWrite:
    """What decode_rotary_attention adds to a decode: the step's unrotated key and value rows
    [B, Hk, D], each sequence's position (cos_sin row) and cache slot."""

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    cos_sin: torch.Tensor
    slot_mapping: torch.Tensor

_TILES = {"masked": 0, "tail": 1, "soft": 2}
# Split a sequence only until the grid holds 2 programs per SM: every batch 1-256 x 1k/4k
# context (table 4k wide, Llama-3.1-8B heads) ran fastest at or within 1 % of this pick on an
# H100, except 32 x 1k (6 % off the unsplit launch), where 8 per SM (the value before
# 2026-12-05) lost 3-12 % at batch 16-128: a split adds a merge kernel and splits the sequence's
# page reads (bench/attn_waves.py --parts, bench/results/attn-parts-h100-2026-12-05-s15b.json).
_PROGRAMS_PER_SM = 2


@triton.jit
def _attend_from(
    t0, end, last_page, q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_row, head_off, dmask, kvh,
    m_i, l_i, acc, stride_cn, stride_cs, stride_sn, stride_ss, stride_sh, scale_log2,
    S: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
    QUANT: tl.constexpr, MASK_T: tl.constexpr, MASK_D: tl.constexpr, K_CVT: tl.constexpr,
    OFF32: tl.constexpr,
):
    """attend_tile over the BLOCK_N tokens from t0 (those before `end` valid) of one sequence."""
    t = t0 + tl.arange(0, BLOCK_N)
    tmask = t < end
    tok_off, sc_off = paged_offsets(bt_row, t, tmask, stride_cn, stride_cs, kvh, stride_sn,
                                    stride_ss, stride_sh, S, QUANT, MASK_T, last_page, OFF32)
    return attend_tile(
        q, kc_ptr, vc_ptr, tok_off, head_off, dmask, tmask, tmask[None, :],
        m_i, l_i, acc, scale_log2, PRECISION, DOT_F32, ks_ptr, vs_ptr, sc_off, QUANT,
        MASK_T, MASK_D, K_CVT,
    )


@triton.jit
def _attend_pairs_from(
    t0, end, qe, qo, kc2, vc2, ks_ptr, vs_ptr, bt_row, head_off, dmask, kvh,
    m_i, l_i, acc_e, acc_o, stride_cn2, stride_cs2, stride_sn, stride_ss, stride_sh, scale_log2,
    S: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
    MASK_T: tl.constexpr, MASK_D: tl.constexpr, OFF32: tl.constexpr, INT8: tl.constexpr,
):
    """attend_pairs over the BLOCK_N tokens from t0 (those before `end` valid) of one sequence
    (cache strides and head_off in pairs)."""
    t = t0 + tl.arange(0, BLOCK_N)
    tmask = t < end
    tok_off, sc_off = paged_offsets(bt_row, t, tmask, stride_cn2, stride_cs2, kvh, stride_sn,
                                    stride_ss, stride_sh, S, True, MASK_T, 0, OFF32)
    return attend_pairs(qe, qo, kc2, vc2, tok_off, head_off, dmask, tmask, m_i, l_i, acc_e, acc_o,
                        scale_log2, PRECISION, DOT_F32, ks_ptr, vs_ptr, sc_off, MASK_T, MASK_D, INT8)


@triton.jit
def _rotate_and_write(
    q_ptr, kn_ptr, vn_ptr, pos_ptr, cs_ptr, slot_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, b, kvh, writes,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos,
    stride_cn, stride_cs, stride_ch, stride_sn, stride_ss, stride_sh, head_dim,
    G: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr, HALF: tl.constexpr, S: tl.constexpr,
    QUANT: tl.constexpr, QMAX: tl.constexpr, IS_INT: tl.constexpr,
):
    """Sequence b's G query heads of KV head kvh, rotated and rounded to q's dtype [G_PAD, D_PAD]
    (as rotary_write_kv gives them). If `writes` (this program's partition holds the last
    position), KV head kvh's new key, rotated and rounded to its dtype, and value go into the
    slot slot_ptr[b] as write_kv stores them (quantized over fp8/int8; a negative slot writes
    nothing), then a CTA barrier: the partition's tiles, read next by the same program, include
    that slot (stores before bar.sync are visible to the whole CTA after it)."""
    cs_row = cs_ptr + tl.load(pos_ptr + b).to(tl.int64) * stride_cos
    q, qmask = rotated_heads(q_ptr + kvh * G * stride_qh, b, stride_qb, stride_qh, cs_row, G, head_dim,
                         HALF, G_PAD, D_PAD)
    if writes:
        slot = tl.load(slot_ptr + b).to(tl.int64)
        dst, sdst, m, hmask = slot_offsets(slot, 1, head_dim, stride_cn, stride_cs, stride_ch,
                                           stride_sn, stride_ss, stride_sh, S, 1, D_PAD)
        k, kmask = rotated_heads(kn_ptr + kvh * stride_kh, b, stride_kt, stride_kh, cs_row, 1, head_dim,
                             HALF, 1, D_PAD)
        store_row(k.to(kn_ptr.dtype.element_ty), kc_ptr + kvh * stride_ch, ks_ptr + kvh * stride_sh,
                  dst, sdst, m, hmask, QUANT, QMAX, IS_INT)
        v = token_rows(vn_ptr + kvh * stride_vh, b, stride_vt, stride_vh, m, 1, D_PAD)
        store_row(v, vc_ptr + kvh * stride_ch, vs_ptr + kvh * stride_sh, dst, sdst, m, hmask,
                  QUANT, QMAX, IS_INT)
        tl.debug_barrier()
    return q.to(q_ptr.dtype.element_ty)


# Arguments that follow the batch (table width, partitions) are not specialized on (== 1, divisible
# by 16): eager steps would compile a variant per new combination (bench/jit_variants.py).
@triton.jit(do_not_specialize=["stride_bt", "num_parts"])
def _decode_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, lens_ptr, out_ptr, lse_ptr, ks_ptr, vs_ptr,
    kn_ptr, vn_ptr, pos_ptr, cs_ptr, slot_ptr,
    stride_qb, stride_qh, stride_cn, stride_cs, stride_ch, stride_bt, stride_ob, stride_oh,
    stride_op, stride_sn, stride_ss, stride_sh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos,
    scale_log2, head_dim, num_parts,
    G: tl.constexpr, G_PAD: tl.constexpr, S: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    PRECISION: tl.constexpr, DOT_F32: tl.constexpr, QUANT: tl.constexpr,
    EVEN_D: tl.constexpr, TILES: tl.constexpr, HEADS_FIRST: tl.constexpr, K_CVT: tl.constexpr,
    PAIRS: tl.constexpr = False, OFF32: tl.constexpr = False, ROPE: tl.constexpr = False,
    HALF: tl.constexpr = 1, QMAX: tl.constexpr = 1.0,
):
    """Programs (KV head, sequence, partition) or (sequence, KV head, partition). ROPE: q, kn
    and vn are the step's unrotated rows [B, H, D]; each program rotates its query heads, and
    the one whose partition holds the sequence's last position also rotates its KV head's new
    key into the cache slot slot_ptr[b] with the value (see _rotate_and_write)."""
    if HEADS_FIRST:  # a sequence's KV heads run side by side: its pages are read together
        kvh = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        num_kv = tl.num_programs(0)
    else:
        b = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1)
        num_kv = tl.num_programs(1)
    part = tl.program_id(2)
    IS_INT: tl.constexpr = kc_ptr.dtype.element_ty == tl.int8  # else fp8 e4m3 where QUANT
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    gmask = g < G
    dmask = d < head_dim
    heads = kvh * G + g
    qmask = gmask[:, None] & dmask[None, :]
    # The sequence splits evenly over the partitions in whole tiles, so a short one
    # occupies few of them (the count is fixed by the table width) and a long one all.
    chunk = tl.cdiv(tl.cdiv(seq_len, num_parts), BLOCK_N) * BLOCK_N
    start = part * chunk
    end = tl.minimum(start + chunk, seq_len)
    if ROPE:
        q = _rotate_and_write(
            q_ptr, kn_ptr, vn_ptr, pos_ptr, cs_ptr, slot_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, b, kvh,
            (start < seq_len) & (seq_len <= end), stride_qb, stride_qh, stride_kt, stride_kh, stride_vt,
            stride_vh, stride_cos, stride_cn, stride_cs, stride_ch, stride_sn, stride_ss, stride_sh,
            head_dim, G, G_PAD, D_PAD, HALF, S, QUANT, QMAX, IS_INT)
    else:
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=qmask, other=0.0)
    q = query_for(q, QUANT, DOT_F32)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    head_off = kvh * stride_ch + d
    last_page = tl.maximum(seq_len - 1, 0) // S
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N  # whole tiles, then a tail
    if PAIRS:  # fp8 e4m3 / int8 read as byte pairs, the head dim split in even and odd elements
        qe, qo = tl.split(tl.reshape(q, [G_PAD, D_PAD // 2, 2]))
        acc_e = tl.zeros([G_PAD, D_PAD // 2], tl.float32)
        acc_o = tl.zeros([G_PAD, D_PAD // 2], tl.float32)
        j = tl.arange(0, D_PAD // 2)
        kc2 = kc_ptr.to(tl.pointer_type(tl.uint16))
        vc2 = vc_ptr.to(tl.pointer_type(tl.uint16))
        head_off2 = kvh * (stride_ch // 2) + j
        for t0 in range(start, full_end, BLOCK_N):
            m_i, l_i, acc_e, acc_o = _attend_pairs_from(
                t0, end, qe, qo, kc2, vc2, ks_ptr, vs_ptr, bt_row, head_off2, 2 * j < head_dim, kvh, m_i, l_i,
                acc_e, acc_o, stride_cn // 2, stride_cs // 2, stride_sn, stride_ss, stride_sh, scale_log2,
                S, BLOCK_N, PRECISION, DOT_F32, 0, not EVEN_D, OFF32, IS_INT)
        if full_end < end:
            m_i, l_i, acc_e, acc_o = _attend_pairs_from(
                full_end, end, qe, qo, kc2, vc2, ks_ptr, vs_ptr, bt_row, head_off2, 2 * j < head_dim, kvh, m_i,
                l_i, acc_e, acc_o, stride_cn // 2, stride_cs // 2, stride_sn, stride_ss, stride_sh, scale_log2,
                S, BLOCK_N, PRECISION, DOT_F32, 1, not EVEN_D, OFF32, IS_INT)
        acc = tl.reshape(tl.join(acc_e, acc_o), [G_PAD, D_PAD]) / pair_pv_gain(IS_INT)
    elif TILES == 2:  # quantized: one loop, unmasked loads (see attend_tile's MASK_T 2)
        for t0 in range(start, end, BLOCK_N):
            m_i, l_i, acc = _attend_from(
                t0, end, last_page, q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_row, head_off, dmask, kvh,
                m_i, l_i, acc, stride_cn, stride_cs, stride_sn, stride_ss, stride_sh, scale_log2,
                S, BLOCK_N, PRECISION, DOT_F32, QUANT, 2, not EVEN_D, K_CVT, OFF32)
    else:  # whole tiles unmasked (TILES 1) or masked (0), then a masked tail
        for t0 in range(start, full_end, BLOCK_N):
            m_i, l_i, acc = _attend_from(
                t0, end, last_page, q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_row, head_off, dmask, kvh,
                m_i, l_i, acc, stride_cn, stride_cs, stride_sn, stride_ss, stride_sh, scale_log2,
                S, BLOCK_N, PRECISION, DOT_F32, QUANT, 1 - TILES, not EVEN_D, K_CVT, OFF32)
        if full_end < end:
            m_i, l_i, acc = _attend_from(
                full_end, end, last_page, q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_row, head_off, dmask, kvh,
                m_i, l_i, acc, stride_cn, stride_cs, stride_sn, stride_ss, stride_sh, scale_log2,
                S, BLOCK_N, PRECISION, DOT_F32, QUANT, 1, not EVEN_D, K_CVT, OFF32)
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    dst = out_ptr + b * stride_ob + heads[:, None] * stride_oh + part * stride_op + d[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=qmask)
    if SPLIT:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + (b * (num_kv * G) + heads) * num_parts + part, lse, mask=gmask)


@triton.jit(do_not_specialize=["num_parts"])
def _merge_kernel(
    part_ptr, lse_ptr, out_ptr, stride_ob, stride_oh, num_heads, num_parts, head_dim,
    P_PAD: tl.constexpr, D_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    p = tl.arange(0, P_PAD)
    d = tl.arange(0, D_PAD)
    row = b * num_heads + h
    lse = tl.load(lse_ptr + row * num_parts + p, mask=p < num_parts, other=float("-inf"))
    mx = tl.max(lse, 0)
    live = lse > float("-inf")
    w = tl.where(live, tl.exp2(lse - tl.where(mx > float("-inf"), mx, 0.0)), 0.0)
    den = tl.sum(w, 0)
    pm = live[:, None] & (d[None, :] < head_dim)
    src = part_ptr + (row * num_parts + p[:, None]) * head_dim + d[None, :]
    o = tl.sum(tl.load(src, mask=pm, other=0.0) * w[:, None], 0)
    o = o / tl.where(den > 0, den, 1.0)
    dst = out_ptr + b * stride_ob + h * stride_oh + d
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=d < head_dim)


def default_partition_size(batch: int, kv_heads: int, max_context: int, device: torch.device) -> int:
    """Largest power-of-two partition (>= 256 tokens) that still gives 2 programs per SM."""
    index = device.index
    if index is None:
        index = torch.cuda.current_device() if device.type == "cuda" else 0
    return partition_for(batch, kv_heads, max_context, num_sms(index))


def partition_for(batch: int, kv_heads: int, max_context: int, sms: int) -> int:
    """default_partition_size on a GPU of `sms` streaming multiprocessors."""
    target = _PROGRAMS_PER_SM * sms
    part = max(_MIN_PARTITION, next_pow2(max_context))
    while part > _MIN_PARTITION and batch * kv_heads * triton.cdiv(max_context, part) < target:
        part //= 2
    return part


def offsets_fit_int32(*views: torch.Tensor, unit: int = 1) -> bool:
    """Whether every offset inside each view (from its first element, in units of `unit`
    elements) fits int32, so the kernels may index them in 32-bit arithmetic (most of a tile's
    address math is 64-bit otherwise: sm_90 SASS per 128-token fp8 tile 588 instructions
    instead of 718; bench/sass_offline.py)."""
    return all(sum((n - 1) * st for n, st in zip(v.shape, v.stride())) // unit < 2**31 - 1
               for v in views if v.numel())


def choose_pairs(pairs: bool | None, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 quant: bool) -> bool:
    """Whether the decode kernel reads the caches as 16-bit pairs of bytes
    (_attention.attend_pairs): asked (pairs), else wherever it applies: an fp8/int8 cache
    [N, S, Hk, D] with an even head dim of at least 32 (the split halves feed dots of >= 16),
    even strides, addresses and storage offsets, and bf16/fp16 queries."""
    can = quant and q.dtype != torch.float32 and all(
        c.element_size() == 1 and c.shape[-1] % 2 == 0 and c.shape[-1] >= 32 and c.stride(-1) == 1
        and all(st % 2 == 0 for st in c.stride()[:-1]) and c.data_ptr() % 2 == 0 for c in (k_cache, v_cache))
    assert not pairs or can, ("pairs needs an fp8 e4m3 or int8 cache with an even head dim >= 32, even strides "
                              "and addresses, and bf16/fp16 queries")
    return can if pairs is None else pairs


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    k_convert: bool | None = None,
    rope: RopeWrite | None = None,
) -> torch.Tensor:
    """One query per sequence (q [B, Hq, D]) over seq_lens[b] cached tokens.

    block_tables int32 [B, max_blocks], seq_lens int32 [B]; caches [N, S, Hk, D] may be layer
    views of a pool. Returns a new [B, Hq, D] tensor in q's dtype. With k_scale/v_scale
    [N, S, Hk] float32, the caches are fp8/int8 and dequantized inside the kernel. k_convert:
    see decode_with_partitions; rope: see decode_rotary_attention.
    """
    max_context = block_tables.shape[1] * k_cache.shape[1] if block_tables.dim() == 2 else 0
    part = default_partition_size(q.shape[0], k_cache.shape[2], max_context, q.device)
    return decode_with_partitions(
        q, k_cache, v_cache, block_tables, seq_lens, scale, part, k_scale, v_scale, k_convert=k_convert,
        rope=rope,
    )


def decode_with_partitions(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    partition_size: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
    tiles: str | None = None,
    heads_first: bool = True,
    max_registers: int | None = None,
    k_convert: bool | None = None,
    pairs: bool | None = None,
    off32: bool | None = None,
    rope: RopeWrite | None = None,
) -> torch.Tensor:
    """paged_decode_attention with an explicit split-K partition size (power of two >= 16):
    the partition count is the table's token width over it, and each sequence spreads over
    them evenly in whole tiles. block_n (keys per tile, a power of two; default 64, 128 over
    fp8/int8 caches, whose tiles are half the bytes: measured best on an H200), num_warps,
    num_stages and tiles are tuning knobs. tiles: "masked" (every tile's loads masked),
    "tail" (tiles wholly inside the sequence unmasked, the last one masked; the default over
    bf16/fp16/fp32 caches) or "soft" (quantized caches only, the default there: no load
    masks at all, scores masked; see attend_tile). heads_first: the grid runs a sequence's KV
    heads next to each other (its pages are read together; bf16 0.8 % faster at 256 x 4k on an
    H200, fp8 even, bench/results/fp8-probe-h200-2026-12-04-s9.log), else sequences first.
    max_registers caps the registers per thread (ptxas -maxnreg; more programs fit an SM).
    k_convert (default: bf16/fp16 queries over fp8 caches): K tiles reach the score dot
    through Triton's convert (see attend_tile's K_CVT); False upcasts them with PTX bit moves
    (the kernel before 2026-12-04, kept to measure against). pairs (default: wherever it
    applies, see choose_pairs): the fp8 or int8 cache is read as 16-bit pairs of bytes (see
    attend_pairs; int8 since 2026-12-07: 717 sm_90 instructions per 128-token tile against
    1,288, bench/sass_offline.py; on an H100 at 256 x 4k 0.819 vs 0.885 ms, over L2-resident
    pages 0.413 vs 0.793, pair-probe-h100-2026-12-07-s23a-256.json), and k_convert and tiles
    are moot. off32 (default: over quantized caches where offsets_fit_int32): cache offsets in
    32-bit arithmetic. Over fp8 on an H100 it lowers the kernel's compute floor (pages in L2,
    bench/pair_probe.py) at 256 x 4k from 0.419 to 0.379 ms; over bf16 it made the kernel
    slower (1.466 vs 1.417 ms at 256 x 4k, 0.412 vs 0.370 at 64 x 4k;
    `pair-probe-h100-2026-12-07-s22a-*.json`), so bf16 keeps 64-bit. rope: q is unrotated and
    the kernel also does rotary_write_kv's work (see decode_rotary_attention)."""
    quant = check_scales(k_cache, k_scale, v_scale)
    fp8_q16 = quant and k_cache.dtype == torch.float8_e4m3fn and q.dtype != torch.float32
    if k_convert is None:
        k_convert = fp8_q16
    assert not k_convert or fp8_q16, "k_convert needs an fp8 e4m3 cache and bf16/fp16 queries"
    group, d = check_attention_inputs(q, k_cache, v_cache, block_tables, quant)
    tiles = tiles or ("soft" if quant else "tail")
    pairs = choose_pairs(pairs, q, k_cache, v_cache, quant)
    want = quant if off32 is None else off32  # default: quantized caches only (bf16: slower, see above)
    fits = want and offsets_fit_int32(k_cache, v_cache, unit=2 if pairs else 1) \
        and offsets_fit_int32(*((k_scale, v_scale) if quant else ()))  # pairs: offsets in pairs
    assert fits or not off32, "off32: the caches' offsets do not fit int32"
    if max_registers is None and quant:  # 138 -> 128 registers: 4 programs per SM instead of 3;
        max_registers = 128  # fp8 at 256 / 64 x 4k 0.756 / 0.209 ms vs 0.818 / 0.246 uncapped,
        # stages 2 (3 was best uncapped) (bench/results/fp8-probe-h200-2026-12-04-s9.log)
    assert tiles in _TILES, f"tiles {tiles!r} must be one of {sorted(_TILES)}"
    assert quant or tiles != "soft", "tiles='soft' needs a quantized cache (finite whatever its bytes)"
    if block_n is None:
        block_n = 128 if quant and not interpreting() else 64
    check_dim("seq_lens", seq_lens, 1)
    check_dtype("seq_lens", seq_lens, (torch.int32,))
    assert seq_lens.is_contiguous(), "seq_lens must be contiguous"
    b, hq, _ = q.shape
    assert seq_lens.shape[0] == b and block_tables.shape[0] == b, (
        f"q has {b} sequences, seq_lens {seq_lens.shape[0]}, block_tables {block_tables.shape[0]}"
    )
    assert partition_size >= 16 and partition_size & (partition_size - 1) == 0, (
        f"partition_size {partition_size} must be a power of two >= 16"
    )
    check_device(q=q, k_cache=k_cache, block_tables=block_tables, seq_lens=seq_lens)
    out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    hk, s = k_cache.shape[2], k_cache.shape[1]
    parts = max(1, triton.cdiv(block_tables.shape[1] * s, partition_size))
    split = parts > 1
    if split:
        dest = torch.empty((b, hq, parts, d), dtype=torch.float32, device=q.device)
        lse = torch.empty((b, hq, parts), dtype=torch.float32, device=q.device)
    else:
        dest, lse = out, out  # lse is unused without a split
    d_pad = max(16, next_pow2(d))
    ks, vs = (k_scale, v_scale) if quant else (k_cache, v_cache)
    grid = (hk, b, parts) if heads_first else (b, hk, parts)
    if rope is None:  # the kernel's rope arguments, unused
        rope_args: tuple = (q, q, seq_lens, q, seq_lens, 0, 0, 0, 0, 0)
        rope_consts: dict = {}
    else:
        rope_args = (rope.k, rope.v, rope.positions, rope.cos_sin, rope.slot_mapping, *rope.k.stride()[:2],
                     *rope.v.stride()[:2], rope.cos_sin.stride(0))
        rope_consts = {"ROPE": True, "HALF": rope.cos_sin.shape[1] // 2,
                       "QMAX": QUANT_MAX.get(k_cache.dtype, 1.0)}
    _decode_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, dest, lse, ks, vs, *rope_args[:5],
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), dest.stride(0), dest.stride(1), dest.stride(2) if split else 0,
        *(ks.stride()[:3] if quant else (0, 0, 0)), *rope_args[5:],
        scale * math.log2(math.e), d, parts,
        G=group, G_PAD=max(16, next_pow2(group)), S=s, D_PAD=d_pad,
        BLOCK_N=min(block_n, partition_size), SPLIT=split,
        PRECISION=dot_precision(q.dtype), DOT_F32=interpreting(), QUANT=quant,
        EVEN_D=d_pad == d, TILES=_TILES[tiles], HEADS_FIRST=heads_first, K_CVT=k_convert, PAIRS=pairs,
        OFF32=fits, **rope_consts, num_warps=num_warps,
        num_stages=num_stages,
        **({"maxnreg": max_registers} if max_registers and not interpreting() else {}),
    )
    if split:
        _merge_kernel[(b, hq)](
            dest, lse, out, out.stride(0), out.stride(1), hq, parts, d,
            P_PAD=next_pow2(parts), D_PAD=d_pad, num_warps=4,
        )
    return out
