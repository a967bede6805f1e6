"""KvLayout: what both ends of a KV transfer must agree on, and its compatibility hash."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class KvLayout:
    """Shape of one worker's paged KV pool.

    The pool is one tensor [num_layers, 2 (k, v), num_blocks, block_size, num_kv_heads, head_dim]
    (`order` = "LKNSHD"); num_blocks is not part of the contract, every other field is.
    """

    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    tp_rank: int = 0
    tp_size: int = 1
    order: str = "LKNSHD"

    def compat_hash(self) -> str:
        return self._compat_hash

    @functools.cached_property
    def _compat_hash(self) -> str:  # every transfer compares it: computed once per layout
        body = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(body).hexdigest()[:16]

    def describe(self) -> str:
        return (
            f"{self.model} layers={self.num_layers} kv_heads={self.num_kv_heads} "
            f"head_dim={self.head_dim} block={self.block_size} dtype={self.dtype} "
            f"tp={self.tp_rank}/{self.tp_size} order={self.order}"
        )

    @property
    def token_bytes_per_layer(self) -> int:
        """Bytes of K plus V for one token of one layer."""
        return 2 * self.num_kv_heads * self.head_dim * _DTYPE_BYTES[self.dtype]


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "int8": 1}
