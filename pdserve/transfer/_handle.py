"""SendHandle state machine shared by chunk-based backends; subclasses only move chunks."""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2
from pdserve.transfer._debug import ChunkDebug
from pdserve.transfer._wire import block_bytes, check_pool, encode_layer
from pdserve.transfer.base import KvTargetSpec, SendHandle, TransferError, TransferState, TransferStats


class ChunkSendHandle(SendHandle):
    """Encodes pushes into KvChunks and tracks state; `_send`, `_complete`, `_cancel` move them."""

    def __init__(
        self, target: KvTargetSpec, kv_pool: torch.Tensor, layout: KvLayout, chunk_bytes: int
    ) -> None:
        check_pool(kv_pool, layout)
        self._target = target
        self._pool = kv_pool
        self._hash = layout.compat_hash()
        self._blocks_per_chunk = max(1, chunk_bytes // block_bytes(layout))
        self._lock = threading.Lock()
        self._state = TransferState.PENDING
        self._error: TransferError | None = None
        self._bytes = 0
        self._chunks = 0
        self._t0 = time.monotonic()
        self._sealed = False  # seal() ran (the final chunk is on its way)
        self._ack: kv_pb2.PushAck | None = None  # the default _seal waits for it
        self._debug = ChunkDebug.from_env()  # off unless the debug variable is set

    @property
    def state(self) -> TransferState:
        return self._state

    def push(self, layer: int, src_block_ids: Sequence[int], dst_block_offset: int) -> None:
        self._push(layer, src_block_ids, dst_block_offset)

    def push_all_layers(self, src_block_ids: Sequence[int], dst_block_offset: int) -> None:
        if self._all_layers_at_once:
            self._push(None, src_block_ids, dst_block_offset)
            return
        for layer in range(self._pool.shape[0]):
            self._push(layer, src_block_ids, dst_block_offset)

    _all_layers_at_once = False  # True: _encode takes layer None (every layer in one piece)

    def _push(self, layer: int | None, src_block_ids: Sequence[int], dst_block_offset: int) -> None:
        end = dst_block_offset + len(src_block_ids)
        if dst_block_offset < 0 or end > len(self._target.block_ids):
            raise ValueError(
                f"target blocks [{dst_block_offset}, {end}) outside the "
                f"{len(self._target.block_ids)} blocks of {self._target.request_id}"
            )
        with self._lock:
            if self._state.final:
                return
            self._state = TransferState.SENDING
        for chunk, nbytes in self._encode(layer, src_block_ids, dst_block_offset):
            if self._state.final:
                return
            self._bytes += nbytes
            self._chunks += 1
            self._send(chunk)

    def _encode(
        self, layer: int, src_block_ids: Sequence[int], dst_block_offset: int
    ) -> list[tuple[Any, int]]:
        """Copy one push out of the pool: (message for _send, payload bytes) per chunk.
        The default makes KvChunks with the bytes inline; nccl and cuda_ipc override it.
        layer is None only where _all_layers_at_once is set."""
        chunks = encode_layer(
            self._pool, layer, src_block_ids, dst_block_offset,
            self._target.request_id, self._hash, self._blocks_per_chunk,
        )
        return [(chunk, len(chunk.data)) for chunk in chunks]

    def seal(self, timeout: float) -> TransferStats:
        with self._lock:
            if self._state == TransferState.ABORTED:
                raise TransferError("KV transfer was aborted", retryable=False, code="CANCELLED")
            if self._error is not None:
                raise self._error
            if self._sealed:
                raise RuntimeError("seal() or finish() called twice")
            self._sealed = True
        last = kv_pb2.KvChunk(request_id=self._target.request_id, layout_hash=self._hash, last=True)
        self._chunks += 1
        try:
            self._seal(last, timeout)
        except TransferError as err:
            self._fail(err)
            raise self._error or err from None
        return TransferStats(self._bytes, time.monotonic() - self._t0, self._chunks)

    def finish(self, timeout: float) -> TransferStats:
        if not self._sealed:
            self.seal(timeout)
        try:
            ack = self._acknowledged(timeout)
            if ack.bytes != self._bytes:
                raise TransferError(
                    f"receiver acknowledged {ack.bytes} bytes, {self._bytes} were sent",
                    retryable=False,
                )
        except TransferError as err:
            self._fail(err)
            raise self._error or err from None
        with self._lock:
            if self._state == TransferState.ABORTED:
                raise TransferError("KV transfer was aborted", retryable=False, code="CANCELLED")
            if self._error is not None:
                raise self._error
            self._state = TransferState.DONE
        return TransferStats(self._bytes, time.monotonic() - self._t0, self._chunks)

    def abort(self) -> None:
        with self._lock:
            if self._state.final:
                return
            self._state = TransferState.ABORTED
        self._cancel()

    def _fail(self, err: TransferError) -> None:
        """Record the first error; later pushes become no-ops and finish raises it."""
        with self._lock:
            if self._state.final:
                return
            self._state = TransferState.FAILED
            self._error = err

    @abstractmethod
    def _send(self, chunk: Any) -> None:
        """Hand one data chunk (what _encode made) to the transport (must not block on the network)."""

    @abstractmethod
    def _complete(self, last: kv_pb2.KvChunk, timeout: float) -> kv_pb2.PushAck:
        """Send the final chunk and wait up to `timeout` for the ack; raise TransferError."""

    def _seal(self, last: kv_pb2.KvChunk, timeout: float) -> None:
        """Make every pushed byte visible to the receiver and send `last`. Here the bytes are
        visible once the receiver wrote them, so this waits for the ack; a direct writer
        (cuda_ipc) knows it sooner and overrides this and `_acknowledged`."""
        self._ack = self._complete(last, timeout)

    def _acknowledged(self, timeout: float) -> kv_pb2.PushAck:
        """The receiver's ack of the sealed transfer (waiting up to `timeout`)."""
        assert self._ack is not None
        return self._ack

    @abstractmethod
    def _cancel(self) -> None:
        """Tear the transport down after abort()."""
