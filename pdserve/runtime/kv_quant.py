"""Quantized KV pools (`--kv-cache-dtype fp8_e4m3|int8`): layout, allocation, layer views.

Design: one scale per (token, KV head), computed on write (dynamic, symmetric: scale =
amax / QMAX). The scales live *inside* the pool tensor, packed after each block's values:

    pool [L, 2, N, S, Hk, D + 4] of float8_e4m3fn or int8 (the shape only sizes a block)
    each block of a layer's K or V, S * Hk * (D + 4) bytes:
        [Hk, S, D] quantized values, then [Hk, S] float32 scales (both head-major)
    values  = [N, S, Hk, D] strided view, strides (S*Hk*(D+4), D, S*D, 1)
    scales  = [N, S, Hk] float32 view of each block's tail, strides (S*Hk*(D+4)/4, 1, S)

So a block of a layer is self-contained: every transfer backend moves the scales with the
values without knowing about them (the wire layout's head_dim is D + 4 and its order names
this packing). Values keep 16-byte aligned rows (D and the block stride are multiples of 16
for D = 128), so the attention kernels load them with wide vector loads; the scales of one
block are contiguous, and those of one KV head in it too (head-major: an attention program,
which reads one KV head, loads a page's 16 scales as 64 contiguous bytes; token-major they were
16 loads 4 * Hk bytes apart, a quarter more memory sectors than the values themselves). The
values are head-major for the same reason: a program's page is one run of S * D bytes, not S
rows of D bytes Hk * D apart; fp8 decode attention ran 3.6-4.8 % faster so on an H100 at
64-256 x 4k context (bf16 pools, whose rows are twice as long, gained nothing and stay
slot-major: bench/layout_probe.py, bench/results/layout-probe-h100-2026-12-06-s17.json).
Per-token scales need no read-modify-write when a block fills up, and
dequantization is one multiply per score column / probability in the attention kernels.
Cost: 4 bytes per row, so fp8 holds 2 * D / (D + 4) times the tokens of bf16 (1.94x, D=128).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.model.spec import ModelSpec

SCALE_BYTES = 4
QUANT_ORDER = "LKN[HSD|HS:f32scale]"  # per block: values, then scales, both head-major (the hash tells)
_STORAGE = {"fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}
KV_CACHE_DTYPES = ("auto", *_STORAGE)


class LayerKv(NamedTuple):
    """One layer's cache views: values [N, S, Hk, D] and scales [N, S, Hk] (None: unquantized)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None


def is_quantized(kv_cache_dtype: str) -> bool:
    """True for fp8_e4m3/int8; False for auto; ValueError for anything else."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES}")
    return kv_cache_dtype != "auto"


def storage_dtype(kv_cache_dtype: str) -> torch.dtype:
    """The torch dtype of a quantized pool's elements."""
    if not is_quantized(kv_cache_dtype):
        raise ValueError("auto is not a quantized KV dtype")
    return _STORAGE[kv_cache_dtype]


def quant_block_bytes(spec: ModelSpec, block_size: int) -> int:
    """Bytes one quantized block takes across all layers, K and V, scales included."""
    return spec.num_layers * 2 * block_size * spec.num_kv_heads * (spec.head_dim + SCALE_BYTES)


def allocate_quant_pool(
    spec: ModelSpec, num_blocks: int, block_size: int, kv_cache_dtype: str,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Zeroed pool [L, 2, N, S, Hk, D + 4] (zero values and zero scales: finite stale slots)."""
    if spec.head_dim % SCALE_BYTES:
        raise ValueError(f"quantized KV needs head_dim % 4 == 0, got {spec.head_dim}")
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
    shape = (spec.num_layers, 2, num_blocks, block_size, spec.num_kv_heads,
             spec.head_dim + SCALE_BYTES)
    return torch.zeros(shape, dtype=storage_dtype(kv_cache_dtype), device=device)


def layer_views(kv_pool: torch.Tensor, layer: int, head_dim: int) -> LayerKv:
    """Views of layer `layer`: plain pools give (k, v, None, None), quantized ones add scales."""
    k, v = kv_pool[layer, 0], kv_pool[layer, 1]
    if kv_pool.shape[-1] == head_dim:
        return LayerKv(k, v, None, None)
    assert kv_pool.shape[-1] == head_dim + SCALE_BYTES and kv_pool.element_size() == 1, (
        f"pool rows of {kv_pool.shape[-1]} {kv_pool.dtype} do not fit head_dim {head_dim}"
    )
    (kq, ks), (vq, vs) = _split_block(k, head_dim), _split_block(v, head_dim)
    return LayerKv(kq, vq, ks, vs)


def _split_block(cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, S, Hk, D + 4] bytes -> values [N, S, Hk, D] and scales [N, S, Hk] float32, both
    stored head-major (module doc)."""
    n, s, hk, _ = cache.shape
    block = cache.reshape(n, -1)  # contiguous: a view
    values = cache.as_strided((n, s, hk, head_dim), (block.stride(0), head_dim, s * head_dim, 1),
                              cache.storage_offset())
    scales = block[:, s * hk * head_dim:].view(torch.float32).view(n, hk, s).transpose(1, 2)
    return values, scales


def quant_kv_layout(
    spec: ModelSpec, block_size: int, kv_cache_dtype: str, model: str | None = None,
    tp_rank: int = 0, tp_size: int = 1,
) -> KvLayout:
    """The transfer layout of a quantized pool: head_dim is the stored row (D + 4 bytes)."""
    storage_dtype(kv_cache_dtype)
    return KvLayout(
        model=model or spec.name or spec.arch,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads // tp_size,
        head_dim=spec.head_dim + SCALE_BYTES,
        block_size=block_size,
        dtype=kv_cache_dtype,
        tp_rank=tp_rank,
        tp_size=tp_size,
        order=QUANT_ORDER,
    )
