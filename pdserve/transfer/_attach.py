"""Direct writers (cuda_ipc): the sender writes the receiver's pool itself, so the receiver's
forget() alone cannot stop it. Both ends of the KvTransfer Control stream live here.

One Control stream per sender and receiver carries every request between them (the messages
name their request), so a request costs its sender no call set-up, only messages:

    attach -> attached | error      before the first write (no write before the yes)
    forgotten                       the receiver dropped the request: stop, synchronise, release
    chunk.. last -> ack | error     the writes' summary (metadata), checked and counted
    release                         every write has landed

Receiver (`DirectWriteReceiver`): validates and counts the summaries, registers the sender as
the reservation's writer, tells it when the request is forgotten, and releases the blocks only
when the writer says its last write landed, or `writer_grace_s` after the stream broke (the
sender died). Sender (`ControlLink` per receiver, `WriterLink` per request).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import grpc

from pdserve.proto import kv_pb2, kv_pb2_grpc
from pdserve.transfer._receiver import Writer
from pdserve.transfer._wire import ChunkRejected, block_bytes, error_from_status
from pdserve.transfer.base import TransferError
from pdserve.transfer.tcp import TcpKvReceiver

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class DirectWriteReceiver(TcpKvReceiver):
    """Decode side of a direct-write backend over any pool (cuda_ipc adds the pool export)."""

    def apply(self, chunk: kv_pb2.KvChunk) -> kv_pb2.PushAck | None:
        if chunk.data:
            raise ChunkRejected(grpc.StatusCode.INVALID_ARGUMENT, "direct-write chunks carry no data")
        return self.account(chunk, max(1, chunk.num_layers) * chunk.num_blocks * block_bytes(self.layout))

    async def Control(
        self, request_iterator: AsyncIterator[kv_pb2.KvControl], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[kv_pb2.KvControlEvent]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[kv_pb2.KvControlEvent | None] = asyncio.Queue()
        writers: dict[str, Writer] = {}  # attached and not yet released, on this stream

        def forgotten(rid: str) -> None:  # from forget(), any thread
            loop.call_soon_threadsafe(events.put_nowait, kv_pb2.KvControlEvent(request_id=rid, forgotten=True))

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    reply = self._control(msg, writers, forgotten)
                    if reply is not None:
                        events.put_nowait(reply)
            finally:
                events.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (event := await events.get()) is not None:
                yield event
            await reader  # re-raises a broken stream
        finally:
            reader.cancel()
            for writer in writers.values():  # the sender is gone: its queued copies may still land
                self.release_writer(writer, lost=True)

    def _control(self, msg: kv_pb2.KvControl, writers: dict[str, Writer],
                 forgotten: Callable[[str], None]) -> kv_pb2.KvControlEvent | None:
        rid, kind = msg.request_id, msg.WhichOneof("kind")
        try:
            if kind == "attach":
                if msg.attach.layout_hash != self.layout.compat_hash():
                    raise ChunkRejected(grpc.StatusCode.FAILED_PRECONDITION,
                                        f"layout_hash: {msg.attach.layout_hash!r} != receiver layout "
                                        f"[{self.layout.describe()}] (hash {self.layout.compat_hash()})")
                if rid in writers:
                    raise ChunkRejected(grpc.StatusCode.ALREADY_EXISTS, f"request {rid} is already attached here")
                writers[rid] = self.attach(rid, msg.attach.block_ids, lambda: forgotten(rid))
                return kv_pb2.KvControlEvent(request_id=rid, attached=True)
            if kind == "chunk":
                if msg.chunk.request_id != rid:
                    raise ChunkRejected(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"chunk.request_id {msg.chunk.request_id!r} != {rid!r}")
                ack = self.apply(msg.chunk)
                return None if ack is None else kv_pb2.KvControlEvent(request_id=rid, ack=ack)
            if kind == "release":
                writer = writers.pop(rid, None)
                if writer is not None:
                    self.release_writer(writer, lost=False)
                return None
            raise ChunkRejected(grpc.StatusCode.INVALID_ARGUMENT, f"control message for {rid!r} names nothing")
        except ChunkRejected as err:
            return kv_pb2.KvControlEvent(request_id=rid, error=kv_pb2.KvError(code=err.code.value[0],
                                                                            message=err.message))


class WriterLink:
    """One request on a ControlLink: attach, the summary and its ack, release. `on_answer` is
    called once with None (attached) or the refusal; `on_lost` when the receiver forgets the
    request or the stream breaks while the writer is attached and not released. Both run on
    the link's reader thread (on_answer on the caller's when the stream is already down)."""

    def __init__(self, control: ControlLink, request_id: str, block_ids: Sequence[int], layout_hash: str,
                 *, on_answer: Callable[[TransferError | None], None],
                 on_lost: Callable[[TransferError], None]) -> None:
        self._control = control
        self.request_id = request_id
        self._block_ids = list(block_ids)
        self._hash = layout_hash
        self._on_answer, self._on_lost = on_answer, on_lost
        self._answered = False
        self._acked = threading.Event()
        self._ack: kv_pb2.PushAck | TransferError | None = None
        self._lock = threading.Lock()
        self._released = False

    def begin(self) -> None:
        """Send the attach and return at once."""
        self._control.register(self)
        self._control.send(kv_pb2.KvControl(request_id=self.request_id, attach=kv_pb2.KvAttach(
            block_ids=self._block_ids, layout_hash=self._hash)))

    def send_summary(self, chunks: Sequence[kv_pb2.KvChunk], last: kv_pb2.KvChunk) -> None:
        for chunk in (*chunks, last):
            self._control.send(kv_pb2.KvControl(request_id=self.request_id, chunk=chunk))

    def wait_ack(self, timeout: float) -> kv_pb2.PushAck:
        """The receiver's ack of the last chunk; TransferError if refused, broken or late."""
        if not self._acked.wait(timeout):
            raise TransferError(f"KV transfer not acknowledged within {timeout}s",
                                retryable=True, code="DEADLINE_EXCEEDED")
        if isinstance(self._ack, TransferError):
            raise self._ack
        assert self._ack is not None
        return self._ack

    def release(self) -> None:
        """Every write has landed: tell the receiver. Idempotent."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._control.send(kv_pb2.KvControl(request_id=self.request_id, release=True))

    def close(self) -> None:
        """Stop listening (after the ack, or after a failure's release)."""
        self._control.unregister(self)

    def _answer(self, err: TransferError | None) -> bool:
        with self._lock:
            first, self._answered = not self._answered, True
        if first:
            self._on_answer(err)
        return first

    def _settle(self, ack: kv_pb2.PushAck | TransferError) -> None:
        if not self._acked.is_set():
            self._ack = ack
            self._acked.set()

    def deliver(self, event: kv_pb2.KvControlEvent) -> None:
        """An event naming this request (the link's reader thread)."""
        kind = event.WhichOneof("kind")
        if kind == "attached":
            self._answer(None)
        elif kind == "forgotten":
            if not self._released:
                self._on_lost(TransferError("the decode worker dropped the request (aborted or lease expired)",
                                            retryable=False, code="NOT_FOUND"))
        elif kind == "ack":
            self._settle(event.ack)
        elif kind == "error":
            err = error_from_status(_CODES.get(event.error.code, grpc.StatusCode.UNKNOWN), event.error.message)
            if not self._answer(err):  # a refused chunk
                self._settle(err)
                self._on_lost(err)

    def broken(self, err: TransferError) -> None:
        """The stream broke (the receiver is gone, or the link was closed)."""
        if not self._answer(err) and not self._released:
            self._on_lost(err)
        self._settle(err)


class ControlLink:
    """The sender's end of one Control stream: messages go through a queue to gRPC's request
    thread, events come back on one reader thread and go to the WriterLink they name. A broken
    stream fails every registered writer; `alive` is then False and the sender opens a new one."""

    def __init__(self, stub: kv_pb2_grpc.KvTransferStub) -> None:
        self._queue: queue.Queue[kv_pb2.KvControl | None] = queue.Queue()
        self._writers: dict[str, WriterLink] = {}
        self._lock = threading.Lock()
        self.alive = True
        self._call = stub.Control(self._requests())
        threading.Thread(target=self._read, name="kv-control", daemon=True).start()

    def register(self, writer: WriterLink) -> None:
        with self._lock:
            if not self.alive:
                dead = True
            else:
                dead = False
                self._writers[writer.request_id] = writer
        if dead:
            writer.broken(TransferError("KV control stream to the decode worker is down",
                                        retryable=True, code="UNAVAILABLE"))

    def unregister(self, writer: WriterLink) -> None:
        with self._lock:
            if self._writers.get(writer.request_id) is writer:
                del self._writers[writer.request_id]

    def send(self, msg: kv_pb2.KvControl) -> None:
        self._queue.put(msg)

    def close(self) -> None:
        self._queue.put(None)
        self._call.cancel()

    def _requests(self) -> Iterator[kv_pb2.KvControl]:
        while (msg := self._queue.get()) is not None:
            yield msg

    def _read(self) -> None:
        err = TransferError("KV control stream ended", retryable=True, code="UNAVAILABLE")
        try:
            for event in self._call:
                with self._lock:
                    writer = self._writers.get(event.request_id)
                if writer is not None:
                    writer.deliver(event)
        except grpc.RpcError as e:
            err = error_from_status(e.code(), e.details() or "") if e.code() != grpc.StatusCode.CANCELLED else (
                TransferError("KV control stream closed", retryable=True, code="UNAVAILABLE"))
        finally:
            self._queue.put(None)  # release gRPC's request thread
            with self._lock:
                self.alive = False
                writers, self._writers = list(self._writers.values()), {}
            for writer in writers:
                writer.broken(err)
