"""nccl backend, prefill side: torch.distributed point-to-point to one decode worker per pair.

Rendezvous: KvTarget.address is the decode worker's TCPStore ("host:port", its
`--kv-nccl-port`). The first start() towards an address claims a pair id, compares KvLayouts
(mismatch: LayoutMismatch naming both) and builds a two-rank group on a PrefixStore. Each pair
has one sender thread (FIFO: header, then the packed [2, n, B, H, D] payload of up to
`chunk_bytes`) and one ack thread (acks come back through the store), so any number of
concurrent transfers is serialised on one ordered stream and cannot deadlock.

Deadlines: finish(timeout) raises a retryable DEADLINE_EXCEEDED TransferError and cancels;
a dead decode worker breaks the pair (send error, store connection lost, or `peer_timeout`),
which fails every transfer on it with a retryable UNAVAILABLE and the next start() reconnects.
Sends and receives time out after `peer_timeout`; idle pairs send heartbeats.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2
from pdserve.transfer import _p2p
from pdserve.transfer._debug import ChunkDebug
from pdserve.transfer._handle import ChunkSendHandle
from pdserve.transfer._nccl_pair import SenderPair
from pdserve.transfer._p2p import Ack, PairState
from pdserve.transfer._wire import error_from_status, gather_layer
from pdserve.transfer.base import (
    KvSender, KvTargetSpec, LayoutMismatch, TransferError, mismatch_message,
)
from pdserve.transfer.nccl_receiver import NcclKvReceiver

__all__ = ["NcclKvReceiver", "NcclKvSender"]


@dataclass
class _Outgoing:
    handle: NcclSendHandle
    header: kv_pb2.KvChunk
    data: torch.Tensor | None  # flat uint8 on the pool's device
    ready: torch.cuda.Event | None  # the gather is done once this fires


class NcclKvSender(KvSender):
    """Prefill-side nccl sender; one pair (group + threads) per decode TCPStore address."""

    def __init__(
        self, layout: KvLayout, chunk_bytes: int = 16 << 20, *,
        connect_timeout: float = 10.0, peer_timeout: float = 10.0,
    ) -> None:
        self.layout = layout
        self._chunk_bytes = chunk_bytes
        self._connect_timeout = connect_timeout
        self._peer_timeout = peer_timeout
        self._lock = threading.Lock()
        self._pairs: dict[str, SenderPair] = {}

    def start(self, target: KvTargetSpec, kv_pool: torch.Tensor) -> NcclSendHandle:
        if len(target.request_id.encode()) > _p2p.MAX_REQUEST_ID:
            raise ValueError(f"request id longer than {_p2p.MAX_REQUEST_ID} bytes")
        pair = self._pair(target.address, kv_pool.device)
        if target.layout_hash != self.layout.compat_hash():
            raise LayoutMismatch(
                f"{mismatch_message(self.layout, pair.peer)}; target names layout hash "
                f"{target.layout_hash}"
            )
        handle = NcclSendHandle(target, kv_pool, self.layout, self._chunk_bytes, pair)
        pair.register(handle)
        return handle

    def close(self) -> None:
        with self._lock:
            pairs = list(self._pairs.values())
            self._pairs.clear()
        for pair in pairs:
            pair.close()

    def _pair(self, address: str, device: torch.device) -> SenderPair:
        with self._lock:  # one connect at a time; a pair is made once per decode worker
            pair = self._pairs.get(address)
            if pair is not None and pair.state == PairState.READY:
                return pair
            pair = SenderPair.connect(address, self.layout, device, self._connect_timeout,
                                       self._peer_timeout)
            self._pairs[address] = pair
            return pair


class NcclSendHandle(ChunkSendHandle):
    """One request on a pair: pushes become queued (header, payload) items."""

    def __init__(self, target: KvTargetSpec, kv_pool: torch.Tensor, layout: KvLayout,
                 chunk_bytes: int, pair: SenderPair) -> None:
        super().__init__(target, kv_pool, layout, chunk_bytes)
        self._pair = pair
        self._acked = threading.Event()
        self._ack: Ack | None = None

    @property
    def request_id(self) -> str:
        return self._target.request_id

    @property
    def debug(self) -> ChunkDebug:
        return self._debug

    def _encode(self, layer: int, src_block_ids: Sequence[int], dst_block_offset: int
                ) -> list[tuple[Any, int]]:
        out = []
        for start, data in gather_layer(self._pool, layer, src_block_ids, self._blocks_per_chunk):
            header = kv_pb2.KvChunk(
                request_id=self._target.request_id, layout_hash=self._hash, layer=layer,
                block_offset=dst_block_offset + start, num_blocks=data.shape[1],
            )
            flat = data.reshape(-1).view(torch.uint8)
            ready = None
            if flat.is_cuda:
                ready = torch.cuda.Event()
                ready.record()
            out.append((_Outgoing(self, header, flat, ready), flat.numel()))
        return out

    def _send(self, chunk: Any) -> None:
        self._pair.enqueue(chunk)

    def _complete(self, last: kv_pb2.KvChunk, timeout: float) -> kv_pb2.PushAck:
        self._pair.enqueue(_Outgoing(self, last, None, None))
        try:
            if not self._acked.wait(timeout):
                raise TransferError(f"KV transfer not acknowledged within {timeout}s",
                                    retryable=True, code="DEADLINE_EXCEEDED")
        finally:
            self._pair.unregister(self)
        ack = self._ack
        if ack is None:
            raise self._error or TransferError("KV pair broken", retryable=True, code="UNAVAILABLE")
        if not ack.ok:
            raise error_from_status(grpc.StatusCode[ack.code], ack.message)
        return kv_pb2.PushAck(bytes=ack.bytes, chunks=ack.chunks)

    def _cancel(self) -> None:
        self._pair.unregister(self)

    def deliver(self, ack: Ack | None, error: TransferError | None = None) -> None:
        """Called by the pair: the receiver's verdict, or the pair's failure."""
        if error is not None:
            self._fail(error)
        elif not ack.ok:
            self._fail(error_from_status(grpc.StatusCode[ack.code], ack.message))
        self._ack = ack
        self._acked.set()
