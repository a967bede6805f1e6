"""Varlen causal prefill attention over the paged cache (twin of reference.paged_prefill_attention).

Sequence b's queries are its last n_b tokens (positions seq_len - n_b ... seq_len - 1); its
KV, cached prefix plus the new tokens already written by write_kv, is read from the paged
cache, which serves prefix caching and chunked prefill alike. A program owns one tile of
BLOCK_Q query tokens times all G query heads of one KV head (BLOCK_M = BLOCK_Q * G rows, so
each K/V tile feeds the whole group) and runs an online softmax over KV tiles up to its last
query's position. Tiles are numbered per sequence from query_start_loc // BLOCK_Q + b, an upper
bound needing no host sync; a program finds its sequence by binary search.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pdserve.kernels._attention import attend_tile, paged_offsets, query_for
from pdserve.kernels._common import check_attention_inputs, check_device, check_dim, check_dtype
from pdserve.kernels._common import check_scales
from pdserve.kernels._common import dot_precision, interpreting, next_pow2


@triton.jit
def _find_sequence(qsl_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest b with query_start_loc[b] // BLOCK_Q + b <= pid (binary search)."""
    lo = pid * 0  # an int32 tensor (num_seqs may be specialized to a constant 1)
    hi = lo + num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_tile = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        lo = tl.where(first_tile <= pid, mid, lo)
        hi = tl.where(first_tile <= pid, hi, mid - 1)
    return lo


# the table width and the sequence count follow the batch: one variant for all (bench/jit_variants.py)
@triton.jit(do_not_specialize=["stride_bt", "num_seqs"])
def _prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, lens_ptr, qsl_ptr, out_ptr, ks_ptr, vs_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cn, stride_cs, stride_ch, stride_bt,
    stride_sn, stride_ss, stride_sh,
    scale_log2, head_dim, num_seqs,
    G: tl.constexpr, S: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, DOT_F32: tl.constexpr, QUANT: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    b = _find_sequence(qsl_ptr, pid, num_seqs, BLOCK_Q)
    q_start = tl.load(qsl_ptr + b)
    n_q = tl.load(qsl_ptr + b + 1) - q_start
    seq_len = tl.load(lens_ptr + b)
    tile = pid - (q_start // BLOCK_Q + b)
    r = tl.arange(0, BLOCK_M)
    qi = tile * BLOCK_Q + r // G
    heads = kvh * G + r % G
    rmask = (r < BLOCK_Q * G) & (qi < n_q)
    q_pos = seq_len - n_q + qi  # >= 0, so key 0 is always visible and no row is all -inf
    d = tl.arange(0, D_PAD)
    dmask = d < head_dim
    tok = (q_start + qi).to(tl.int64)
    io_mask = rmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + tok[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=io_mask, other=0.0)
    q = query_for(q, QUANT, DOT_F32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    # Keys up to the tile's last query position; an empty tile (past n_q) reads nothing.
    kv_end = seq_len - n_q + tl.minimum(tile * BLOCK_Q + BLOCK_Q, n_q)
    kv_end = tl.where(tile * BLOCK_Q < n_q, kv_end, 0)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    head_off = kvh * stride_ch + d
    for t0 in range(0, kv_end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        tmask = t < kv_end
        tok_off, sc_off = paged_offsets(bt_row, t, tmask, stride_cn, stride_cs, kvh, stride_sn,
                                        stride_ss, stride_sh, S, QUANT)
        valid = tmask[None, :] & (t[None, :] <= q_pos[:, None])
        m_i, l_i, acc = attend_tile(
            q, kc_ptr, vc_ptr, tok_off, head_off, dmask, tmask, valid,
            m_i, l_i, acc, scale_log2, PRECISION, DOT_F32, ks_ptr, vs_ptr, sc_off, QUANT,
            True, True,
        )
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    dst = out_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=io_mask)


def _default_tiles(head_dim: int, group: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): small tiles in the interpreter, big ones on GPUs."""
    if interpreting():
        return max(16, next_pow2(group)), 16, 4
    if head_dim <= 128:
        return 128, 64, 8
    return 64, 32, 4


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a batch of query runs over their paged KV.

    Sequence b owns queries q[query_start_loc[b]:query_start_loc[b+1]], which are its last
    tokens: positions seq_lens[b] - n_b ... seq_lens[b] - 1. Its KV (cached prefix and the new
    tokens, already written) lies in blocks block_tables[b]. Returns [T, Hq, D]. With
    k_scale/v_scale [N, S, Hk] float32 the caches are fp8/int8, dequantized in the kernel.
    """
    d = q.shape[-1] if q.dim() == 3 else 0
    group = q.shape[1] // k_cache.shape[2] if q.dim() == 3 and k_cache.dim() == 4 else 1
    block_m, block_n, warps = _default_tiles(d, max(group, 1))
    return prefill_with_tiles(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
        block_m, block_n, warps, k_scale, v_scale,
    )


def prefill_with_tiles(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    block_m: int,
    block_n: int,
    num_warps: int = 4,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """paged_prefill_attention with explicit tile sizes (powers of two >= 16, BLOCK_M >= G)."""
    quant = check_scales(k_cache, k_scale, v_scale)
    group, d = check_attention_inputs(q, k_cache, v_cache, block_tables, quant)
    for name, t in (("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        check_dim(name, t, 1)
        check_dtype(name, t, (torch.int32,))
        assert t.is_contiguous(), f"{name} must be contiguous"
    b = seq_lens.shape[0]
    assert query_start_loc.shape[0] == b + 1, (
        f"query_start_loc has {query_start_loc.shape[0]} entries for {b} sequences (need B+1)"
    )
    assert block_tables.shape[0] == b, f"block_tables has {block_tables.shape[0]} rows, B={b}"
    assert block_m >= 16 and block_n >= 16 and block_m >= group, "tiles too small"
    check_device(q=q, k_cache=k_cache, block_tables=block_tables, seq_lens=seq_lens,
                 query_start_loc=query_start_loc)
    t, hq, _ = q.shape
    out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t == 0 or b == 0:
        return out
    block_q = block_m // group
    hk, s = k_cache.shape[2], k_cache.shape[1]
    ks, vs = (k_scale, v_scale) if quant else (k_cache, v_cache)
    _prefill_kernel[(t // block_q + b, hk)](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, ks, vs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        *(ks.stride()[:3] if quant else (0, 0, 0)),
        scale * math.log2(math.e), d, b,
        G=group, S=s, D_PAD=max(16, next_pow2(d)),
        BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION=dot_precision(q.dtype), DOT_F32=interpreting(), QUANT=quant,
        num_warps=num_warps, num_stages=2,
    )
    return out
