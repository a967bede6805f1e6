"""tcp backend: KV bytes in chunks over a client-streaming gRPC call (the CPU/CI path).

Sender: sync gRPC, one channel per decode address, a Push stream per transfer fed from a queue
(gRPC consumes the request iterator on its own thread, so push() never waits on the network).
Receiver: an async servicer for a grpc.aio server; create that server with TCP_GRPC_OPTIONS.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2, kv_pb2_grpc
from pdserve.transfer._handle import ChunkSendHandle
from pdserve.transfer._receiver import ReceiverCore
from pdserve.transfer._wire import ChunkRejected, error_from_status
from pdserve.transfer.base import (
    KvSender,
    KvTargetSpec,
    LayoutMismatch,
    TransferError,
    layout_from_proto,
    layout_to_proto,
    mismatch_message,
)

MAX_MESSAGE_BYTES = 64 << 20
#: Channel/server options both ends need: chunks are larger than gRPC's 4 MiB default.
TCP_GRPC_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
_INLINE_WRITE_BYTES = 1 << 20  # larger chunks are written off the event loop


def _rpc_error(err: grpc.RpcError) -> TransferError:
    return error_from_status(err.code(), err.details() or "")


class TcpKvSender(KvSender):
    """Prefill-side tcp sender; one channel and one cached Handshake per decode address."""

    def __init__(
        self,
        layout: KvLayout,
        chunk_bytes: int = 4 << 20,
        *,
        handshake_timeout: float = 5.0,
        call_timeout: float = 300.0,
    ) -> None:
        if not 0 < chunk_bytes <= MAX_MESSAGE_BYTES // 2:
            raise ValueError(f"chunk_bytes must be in (0, {MAX_MESSAGE_BYTES // 2}]")
        self.layout = layout
        self._chunk_bytes = chunk_bytes
        self._handshake_timeout = handshake_timeout
        self._call_timeout = call_timeout
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._peer_layouts: dict[str, KvLayout] = {}

    def start(self, target: KvTargetSpec, kv_pool: torch.Tensor) -> _TcpSendHandle:
        stub = kv_pb2_grpc.KvTransferStub(self._channel(target.address))
        peer = self._handshake(target.address, stub)
        if target.layout_hash != self.layout.compat_hash():
            raise LayoutMismatch(
                f"{mismatch_message(self.layout, peer)}; target names layout hash "
                f"{target.layout_hash}"
            )
        return _TcpSendHandle(
            target, kv_pool, self.layout, self._chunk_bytes, stub, self._call_timeout,
            on_mismatch=lambda: self._forget_peer(target.address),
        )

    def close(self) -> None:
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
            self._peer_layouts.clear()
        for channel in channels:
            channel.close()

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = grpc.insecure_channel(address, options=TCP_GRPC_OPTIONS)
                self._channels[address] = channel
            return channel

    def _handshake(self, address: str, stub: kv_pb2_grpc.KvTransferStub) -> KvLayout:
        with self._lock:
            peer = self._peer_layouts.get(address)
        if peer is not None:
            return peer
        try:
            reply = stub.Handshake(layout_to_proto(self.layout), timeout=self._handshake_timeout)
        except grpc.RpcError as err:
            raise _rpc_error(err) from None
        peer = layout_from_proto(reply.layout)
        if peer.compat_hash() != self.layout.compat_hash():
            raise LayoutMismatch.between(self.layout, peer)
        with self._lock:
            self._peer_layouts[address] = peer
        return peer

    def _forget_peer(self, address: str) -> None:
        """The peer changed its layout since the handshake: handshake again next time."""
        with self._lock:
            self._peer_layouts.pop(address, None)


class _TcpSendHandle(ChunkSendHandle):
    """One Push stream; chunks go through a queue to gRPC's request-consuming thread."""

    def __init__(
        self,
        target: KvTargetSpec,
        kv_pool: torch.Tensor,
        layout: KvLayout,
        chunk_bytes: int,
        stub: kv_pb2_grpc.KvTransferStub,
        call_timeout: float,
        on_mismatch: Callable[[], None],
    ) -> None:
        super().__init__(target, kv_pool, layout, chunk_bytes)
        self._queue: queue.Queue[kv_pb2.KvChunk | None] = queue.Queue()
        self._on_mismatch = on_mismatch
        self._future = stub.Push.future(self._requests(), timeout=call_timeout)
        self._future.add_done_callback(self._on_done)

    def _requests(self) -> Iterator[kv_pb2.KvChunk]:
        while (chunk := self._queue.get()) is not None:
            self._debug.before_send(chunk)
            yield chunk

    def _on_done(self, future: grpc.Future) -> None:
        self._queue.put(None)  # release gRPC's request thread if the call ended early
        if future.cancelled():
            return
        err = future.exception()
        if isinstance(err, grpc.RpcError):
            self._fail(self._map(err))

    def _map(self, err: grpc.RpcError) -> TransferError:
        mapped = _rpc_error(err)
        if isinstance(mapped, LayoutMismatch):
            self._on_mismatch()
        return mapped

    def _send(self, chunk: kv_pb2.KvChunk) -> None:
        self._queue.put(chunk)

    def _complete(self, last: kv_pb2.KvChunk, timeout: float) -> kv_pb2.PushAck:
        self._queue.put(last)
        self._queue.put(None)  # half-close: the iterator ends
        try:
            return self._future.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self._future.cancel()
            raise TransferError(
                f"KV transfer not acknowledged within {timeout}s",
                retryable=True,
                code="DEADLINE_EXCEEDED",
            ) from None
        except grpc.FutureCancelledError:
            raise TransferError("KV transfer was cancelled", retryable=False, code="CANCELLED")
        except grpc.RpcError as err:
            raise self._map(err) from None

    def _cancel(self) -> None:
        self._future.cancel()
        self._queue.put(None)


class TcpKvReceiver(ReceiverCore, kv_pb2_grpc.KvTransferServicer):
    """Decode-side tcp receiver: an async KvTransfer servicer over this worker's pool."""

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register on a grpc.aio server (built with options=TCP_GRPC_OPTIONS)."""
        kv_pb2_grpc.add_KvTransferServicer_to_server(self, server)

    async def Handshake(
        self, request: kv_pb2.KvLayout, context: grpc.aio.ServicerContext
    ) -> kv_pb2.HandshakeReply:
        sender = layout_from_proto(request)
        mine = self.layout.compat_hash()
        if sender.compat_hash() != mine or (request.hash and request.hash != mine):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, mismatch_message(sender, self.layout)
            )
        return kv_pb2.HandshakeReply(layout=layout_to_proto(self.layout))

    async def Push(
        self, request_iterator: AsyncIterator[kv_pb2.KvChunk], context: grpc.aio.ServicerContext
    ) -> kv_pb2.PushAck:
        async for chunk in request_iterator:
            try:
                if len(chunk.data) > _INLINE_WRITE_BYTES:
                    ack = await asyncio.to_thread(self.apply, chunk)
                else:
                    ack = self.apply(chunk)
            except ChunkRejected as err:
                await context.abort(err.code, err.message)
            if ack is not None:
                return ack
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, "Push stream ended before the last chunk"
        )
