"""The paged KV pool: one tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]."""

from __future__ import annotations

import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.model.spec import ModelSpec

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dtype_name(dtype: torch.dtype) -> str:
    """The KvLayout name of a torch dtype (ValueError for one the pool does not support)."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"KV cache dtype {dtype} is not supported ({list(_DTYPE_NAMES.values())})") from None


def kv_layout(
    spec: ModelSpec, block_size: int, dtype: torch.dtype, model: str | None = None,
    tp_rank: int = 0, tp_size: int = 1,
) -> KvLayout:
    """The KvLayout both ends of a transfer compare (order "LKNSHD", see KvLayout)."""
    return KvLayout(
        model=model or spec.name or spec.arch,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads // tp_size,
        head_dim=spec.head_dim,
        block_size=block_size,
        dtype=dtype_name(dtype),
        tp_rank=tp_rank,
        tp_size=tp_size,
    )


def block_bytes(spec: ModelSpec, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, K and V."""
    elem = torch.empty((), dtype=dtype).element_size()
    return spec.num_layers * 2 * block_size * spec.num_kv_heads * spec.head_dim * elem


def num_blocks_for_bytes(spec: ModelSpec, block_size: int, dtype: torch.dtype, nbytes: int) -> int:
    """How many whole blocks fit in `nbytes` (ValueError if not even one does)."""
    n = nbytes // block_bytes(spec, block_size, dtype)
    if n < 1:
        raise ValueError(
            f"{nbytes} bytes hold no KV block (one block takes {block_bytes(spec, block_size, dtype)})"
        )
    return int(n)


def allocate_kv_pool(
    spec: ModelSpec, num_blocks: int, block_size: int, dtype: torch.dtype,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Zeroed pool [L, 2, num_blocks, block_size, Hk, D]; zeros so that stale slots are finite."""
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
    shape = (spec.num_layers, 2, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)
