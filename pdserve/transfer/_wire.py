"""Chunk encoding and validation shared by every chunk-based backend (tcp, loopback).

The one place where a KvChunk is checked before it may touch a pool, and where gRPC status
codes become TransferErrors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import grpc
import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2
from pdserve.transfer.base import LayoutMismatch, TransferError

_TORCH_DTYPES: Mapping[str, torch.dtype] = MappingProxyType({
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "int8": torch.int8,
})

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class ChunkRejected(Exception):
    """A chunk failed validation; nothing of it was written."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def torch_dtype(layout: KvLayout) -> torch.dtype:
    """The torch dtype of a layout's pool."""
    try:
        return _TORCH_DTYPES[layout.dtype]
    except KeyError:
        raise ValueError(f"unsupported KV dtype {layout.dtype!r}") from None


def block_bytes(layout: KvLayout) -> int:
    """Bytes of K plus V of one block of one layer."""
    return layout.block_size * layout.token_bytes_per_layer


def check_pool(kv_pool: torch.Tensor, layout: KvLayout) -> None:
    """Raise ValueError unless `kv_pool` is [L, 2, N, B, H, D] of the layout's dtype."""
    want = (layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)
    shape = tuple(kv_pool.shape)
    if kv_pool.dim() != 6 or shape[:2] + shape[3:] != want:
        raise ValueError(f"KV pool shape {shape} does not match layout [{layout.describe()}]")
    if kv_pool.dtype != torch_dtype(layout):
        raise ValueError(f"KV pool dtype {kv_pool.dtype} does not match layout {layout.dtype}")


def encode_layer(
    kv_pool: torch.Tensor,
    layer: int,
    src_block_ids: Sequence[int],
    dst_block_offset: int,
    request_id: str,
    layout_hash: str,
    blocks_per_chunk: int,
) -> list[kv_pb2.KvChunk]:
    """Copy layer `layer` of the source blocks out of the pool into KvChunks of at most
    `blocks_per_chunk` blocks each (K then V per chunk). The copies are done when this returns."""
    chunks = []
    for start, gathered in gather_layer(kv_pool, layer, src_block_ids, blocks_per_chunk):
        chunks.append(
            kv_pb2.KvChunk(
                request_id=request_id,
                layout_hash=layout_hash,
                layer=layer,
                block_offset=dst_block_offset + start,
                num_blocks=gathered.shape[1],
                data=gathered.cpu().view(torch.uint8).numpy().tobytes(),
            )
        )
    return chunks


def gather_layer(
    kv_pool: torch.Tensor, layer: int, src_block_ids: Sequence[int], blocks_per_chunk: int
) -> list[tuple[int, torch.Tensor]]:
    """Check the source range and gather layer `layer` of the blocks into fresh contiguous
    [2, n, B, H, D] tensors of at most `blocks_per_chunk` blocks, on the pool's device.
    Returns (index of the first block within src_block_ids, tensor) pairs."""
    num_layers, _, num_blocks = kv_pool.shape[:3]
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} out of range [0, {num_layers})")
    if any(not 0 <= b < num_blocks for b in src_block_ids):
        raise ValueError(f"source block ids out of range [0, {num_blocks}): {src_block_ids}")
    out = []
    for start in range(0, len(src_block_ids), blocks_per_chunk):
        ids = list(src_block_ids[start : start + blocks_per_chunk])
        index = torch.tensor(ids, dtype=torch.long, device=kv_pool.device)
        # Advanced indexing gathers into a fresh contiguous [2, n, B, H, D] tensor.
        out.append((start, kv_pool[layer][:, index]))
    return out


def check_chunk(
    chunk: kv_pb2.KvChunk,
    layout: KvLayout,
    reserved: Sequence[int],
    data_len: int | None = None,
) -> tuple[int, ...]:
    """Validate a chunk of an expected request against the receiver's layout and the
    request's reserved blocks; return the destination block ids (from the reservation,
    never from the wire). `data_len` is the payload size when the payload travels outside
    `chunk.data` (nccl: a separate tensor; cuda_ipc: written by the peer). Raises ChunkRejected."""
    if chunk.layout_hash != layout.compat_hash():
        raise ChunkRejected(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"chunk layout hash {chunk.layout_hash!r} != receiver layout "
            f"[{layout.describe()}] (hash {layout.compat_hash()})",
        )
    layers = max(1, chunk.num_layers)
    if chunk.layer + layers > layout.num_layers:
        raise ChunkRejected(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"layers [{chunk.layer}, {chunk.layer + layers}) out of range [0, {layout.num_layers})",
        )
    if layers > 1 and (chunk.data or data_len is None):
        raise ChunkRejected(grpc.StatusCode.INVALID_ARGUMENT, "num_layers > 1 is for direct-write chunks (no data)")
    end = chunk.block_offset + chunk.num_blocks
    if end > len(reserved):
        raise ChunkRejected(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"blocks [{chunk.block_offset}, {end}) outside the {len(reserved)} reserved blocks",
        )
    want = layers * chunk.num_blocks * block_bytes(layout)
    got = len(chunk.data) if data_len is None else data_len
    if got != want:
        raise ChunkRejected(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"data is {got} bytes, {chunk.num_blocks} blocks need {want}",
        )
    return tuple(reserved[chunk.block_offset : end])


def error_from_status(code: grpc.StatusCode, details: str) -> TransferError:
    """Map a gRPC status (from the wire or a ChunkRejected) to a TransferError."""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return LayoutMismatch(details)
    return TransferError(
        f"KV transfer failed: {code.name}: {details}",
        retryable=code in _RETRYABLE,
        code=code.name,
    )
