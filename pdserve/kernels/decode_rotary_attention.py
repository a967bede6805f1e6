"""Rotary embedding, KV write and paged decode attention in one kernel (Triton twin of
reference.decode_rotary_attention).

In a decode step every sequence has one new token. Its rotated key and its value are only
stored into the cache, and its rotated query only feeds attention, so the decode kernel does
rotary_write_kv's work too: every program rotates its query heads in registers, and the program
whose split-K partition holds the sequence's last position stores its KV head's new key and
value into the slot before it reads its tiles (see decode_attention._rotate_and_write). One
launch per layer instead of two, and no rotated q round trip through memory.
"""

from __future__ import annotations

import torch

from pdserve.kernels.decode_attention import RopeWrite, paged_decode_attention
from pdserve.kernels.rotary import check_rotary
from pdserve.kernels.write_kv import check_write_kv


def decode_rotary_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """rotary_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, ...), then
    paged_decode_attention of the rotated q over the cache: q [B, Hq, D], k, v [B, Hk, D] (may
    be strided views of a fused qkv), one new token per sequence whose slot is that of position
    seq_lens[b] - 1 in block_tables[b]. Returns [B, Hq, D] in q's dtype; the cache holds the new
    rows afterwards, as after rotary_write_kv (a negative slot writes nothing)."""
    check_rotary(q, k, positions, cos_sin)
    check_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return paged_decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale,
        rope=RopeWrite(k, v, positions, cos_sin, slot_mapping),
    )
