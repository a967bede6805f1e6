"""loopback backend: an in-process sender/receiver pair for tests.

Same chunks, checks and errors as tcp, without a network: a push is applied to the receiver
synchronously (deterministic for tests), and the receiver is found by address in a dict.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2
from pdserve.transfer._handle import ChunkSendHandle
from pdserve.transfer._receiver import ReceiverCore
from pdserve.transfer._wire import ChunkRejected, error_from_status
from pdserve.transfer.base import (
    KvSender,
    KvTargetSpec,
    LayoutMismatch,
    TransferError,
    mismatch_message,
)


class LoopbackKvReceiver(ReceiverCore):
    """Decode-side fake: the tcp receiver's bookkeeping, reached by direct calls."""

    def handshake(self, sender: KvLayout) -> KvLayout:
        """Return this receiver's layout; LayoutMismatch if `sender` differs."""
        if sender.compat_hash() != self.layout.compat_hash():
            raise LayoutMismatch.between(sender, self.layout)
        return self.layout


class LoopbackKvSender(KvSender):
    """Prefill-side fake that writes straight into a LoopbackKvReceiver of the same process."""

    def __init__(
        self,
        layout: KvLayout,
        receiver_by_address: Mapping[str, LoopbackKvReceiver],
        chunk_bytes: int = 4 << 20,
    ) -> None:
        self.layout = layout
        self._receivers = receiver_by_address
        self._chunk_bytes = chunk_bytes

    def start(self, target: KvTargetSpec, kv_pool: torch.Tensor) -> _LoopbackSendHandle:
        receiver = self._receivers.get(target.address)
        if receiver is None:
            raise TransferError(
                f"no loopback receiver at {target.address!r}", retryable=True, code="UNAVAILABLE"
            )
        peer = receiver.handshake(self.layout)
        if target.layout_hash != self.layout.compat_hash():
            raise LayoutMismatch(
                f"{mismatch_message(self.layout, peer)}; target names layout hash "
                f"{target.layout_hash}"
            )
        return _LoopbackSendHandle(target, kv_pool, self.layout, self._chunk_bytes, receiver)

    def close(self) -> None:
        """Nothing to release."""


class _LoopbackSendHandle(ChunkSendHandle):
    def __init__(
        self,
        target: KvTargetSpec,
        kv_pool: torch.Tensor,
        layout: KvLayout,
        chunk_bytes: int,
        receiver: LoopbackKvReceiver,
    ) -> None:
        super().__init__(target, kv_pool, layout, chunk_bytes)
        self._receiver = receiver

    def _send(self, chunk: kv_pb2.KvChunk) -> None:
        self._debug.before_send(chunk)
        try:
            self._receiver.apply(chunk)
        except ChunkRejected as err:
            self._fail(error_from_status(err.code, err.message))

    def _complete(self, last: kv_pb2.KvChunk, timeout: float) -> kv_pb2.PushAck:
        try:
            ack = self._receiver.apply(last)
        except ChunkRejected as err:
            raise error_from_status(err.code, err.message) from None
        if ack is None:  # unreachable: a last chunk always yields an ack
            raise error_from_status(grpc.StatusCode.INTERNAL, "no ack for the last chunk")
        return ack

    def _cancel(self) -> None:
        """Chunks were applied synchronously; nothing is in flight."""
