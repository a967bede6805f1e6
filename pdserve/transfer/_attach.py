"""Direct writers (cuda_ipc): the sender writes the receiver's pool itself, so the receiver's
forget() alone cannot stop it. Both ends of the KvTransfer Attach call live here.

Receiver (`DirectWriteReceiver`): Push carries metadata chunks only (validated against the
reservation and counted); Attach registers the sender as the reservation's writer before its
first write, tells it when the request is forgotten, and releases the blocks only when the
writer says its last write landed, or `writer_grace_s` after its call broke (it died).

Sender (`WriterLink`): sends its attach in the handle's constructor and waits for the answer
before the first write (no write before the receiver said yes; the round trip overlaps the
first layer's compute), turns a `forgotten` event or a broken call into a failure of the handle, and sends
`release` once the handle's copies are synchronised.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import grpc

from pdserve.proto import kv_pb2, kv_pb2_grpc
from pdserve.transfer._wire import ChunkRejected, block_bytes, error_from_status
from pdserve.transfer.base import TransferError
from pdserve.transfer.tcp import TcpKvReceiver


class DirectWriteReceiver(TcpKvReceiver):
    """Decode side of a direct-write backend over any pool (cuda_ipc adds the pool export)."""

    def apply(self, chunk: kv_pb2.KvChunk) -> kv_pb2.PushAck | None:
        if chunk.data:
            raise ChunkRejected(grpc.StatusCode.INVALID_ARGUMENT, "direct-write chunks carry no data")
        return self.account(chunk, max(1, chunk.num_layers) * chunk.num_blocks * block_bytes(self.layout))

    async def Attach(
        self, request_iterator: AsyncIterator[kv_pb2.KvAttach], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[kv_pb2.KvAttachEvent]:
        requests = request_iterator.__aiter__()
        try:
            first = await requests.__anext__()
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Attach ended before its first message")
        if first.layout_hash != self.layout.compat_hash():
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"layout_hash: {first.layout_hash!r} != receiver layout "
                                f"[{self.layout.describe()}] (hash {self.layout.compat_hash()})")
        loop = asyncio.get_running_loop()
        forgotten = asyncio.Event()
        try:
            writer = self.attach(first.request_id, first.block_ids,
                                 lambda: loop.call_soon_threadsafe(forgotten.set))
        except ChunkRejected as err:
            await context.abort(err.code, err.message)
        reader = asyncio.ensure_future(_until_release(requests))
        waiter = asyncio.ensure_future(forgotten.wait())
        released = False
        try:
            yield kv_pb2.KvAttachEvent(attached=True)
            await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():
                yield kv_pb2.KvAttachEvent(forgotten=True)
                await reader
            released = reader.result()
        finally:
            reader.cancel()
            waiter.cancel()
            self.release_writer(writer, lost=not released)


async def _until_release(requests: AsyncIterator[kv_pb2.KvAttach]) -> bool:
    """True when the writer sent `release`; False when its stream ended without it."""
    async for msg in requests:
        if msg.release:
            return True
    return False


class WriterLink:
    """Sender side of one Attach call; `open` attaches, `release` ends it."""

    def __init__(
        self,
        stub: kv_pb2_grpc.KvTransferStub,
        request_id: str,
        block_ids: Sequence[int],
        layout_hash: str,
        *,
        call_timeout: float,
        on_lost: Callable[[TransferError], None],
    ) -> None:
        self._stub = stub
        self._first = kv_pb2.KvAttach(request_id=request_id, block_ids=list(block_ids),
                                      layout_hash=layout_hash)
        self._call_timeout = call_timeout
        self._queue: queue.Queue[kv_pb2.KvAttach | None] = queue.Queue()
        self._on_lost = on_lost
        self._attached = threading.Event()
        self._error: TransferError | None = None
        self._lock = threading.Lock()
        self._released = False
        self._call: grpc.Call | None = None

    def open(self, timeout: float) -> None:
        """Attach; returns once the receiver accepted this writer (`begin` + `wait_attached`)."""
        self.begin()
        self.wait_attached(timeout)

    def begin(self) -> None:
        """Send the attach request and return at once (the answer comes on a watcher thread)."""
        self._queue.put(self._first)
        self._call = self._stub.Attach(self._requests(), timeout=self._call_timeout)
        threading.Thread(target=self._watch, name="kv-attach", daemon=True).start()

    def wait_attached(self, timeout: float) -> None:
        """Return once the receiver accepted this writer. Raises TransferError (NOT_FOUND:
        forgotten or unknown; DEADLINE_EXCEEDED, retryable: no answer). After it returns,
        `on_lost` is called when the receiver forgets the request or the call breaks."""
        if not self._attached.wait(timeout):
            self._call.cancel()
            raise TransferError(f"KV attach not answered within {timeout}s",
                                retryable=True, code="DEADLINE_EXCEEDED")
        if self._error is not None:
            raise self._error

    def release(self) -> None:
        """Every write has landed: tell the receiver, then end the call. Idempotent."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._queue.put(kv_pb2.KvAttach(release=True))
        self._queue.put(None)

    def _requests(self) -> Iterator[kv_pb2.KvAttach]:
        while (msg := self._queue.get()) is not None:
            yield msg

    def _watch(self) -> None:
        try:
            for event in self._call:
                if event.attached:
                    self._attached.set()
                elif event.forgotten and not self._released:  # after release: nothing to stop
                    self._on_lost(TransferError(
                        "the decode worker dropped the request (aborted or lease expired)",
                        retryable=False, code="NOT_FOUND"))
        except grpc.RpcError as err:
            mapped = error_from_status(err.code(), err.details() or "")
            if not self._attached.is_set():
                self._error = mapped
            elif not self._released:
                self._on_lost(mapped)
        finally:
            self._queue.put(None)  # release gRPC's request thread if the call ended early
            self._attached.set()
