"""Receiver bookkeeping shared by every backend: reservations, checked writes, forget, and
the writers that write into the pool themselves (cuda_ipc), whose blocks forget() must not hand
back while one of their writes may still land."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2
from pdserve.transfer._debug import ChunkDebug
from pdserve.transfer._wire import ChunkRejected, check_chunk, check_pool, torch_dtype
from pdserve.transfer.base import CompletionCallback, KvReceiver

_FORGOTTEN_MEMORY = 4096  # recently forgotten ids kept only to give a clearer refusal
log = logging.getLogger(__name__)


@dataclass
class Writer:
    """A peer attached to one reservation that writes into the pool itself (cuda_ipc)."""

    reservation: _Reservation
    notify: Callable[[], None]  # asks the peer to stop writing (called once, on forget)
    done: bool = False  # every write of the peer has landed (or it is gone past the grace)


@dataclass
class _Reservation:
    block_ids: tuple[int, ...]
    # Held for the check+write of one chunk and by forget(): once forget() returns, no write
    # for this request is in progress and none can start.
    lock: threading.Lock = field(default_factory=threading.Lock)
    bytes: int = 0
    chunks: int = 0
    complete: bool = False
    forgotten: bool = False
    writer: Writer | None = None
    on_released: Callable[[], None] | None = None  # forgotten while its writer was still live


class ReceiverCore(KvReceiver):
    """KvReceiver over one pool [L, 2, N, B, H, D]; `apply` validates and writes one chunk."""

    def __init__(
        self,
        kv_pool: torch.Tensor,
        layout: KvLayout,
        on_complete: CompletionCallback | None = None,
        *,
        writer_grace_s: float = 5.0,
    ) -> None:
        check_pool(kv_pool, layout)
        self._writer_grace_s = writer_grace_s
        self.layout = layout
        self._pool = kv_pool
        self._dtype = torch_dtype(layout)
        self._on_complete = on_complete
        self._lock = threading.Lock()
        self._reservations: dict[str, _Reservation] = {}
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        self._debug = ChunkDebug.from_env()  # off unless the debug variable is set

    def expect(self, request_id: str, block_ids: Sequence[int]) -> None:
        num_blocks = self._pool.shape[2]
        ids = tuple(int(b) for b in block_ids)
        if any(not 0 <= b < num_blocks for b in ids):
            raise ValueError(f"block ids out of range [0, {num_blocks}): {ids}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate block ids for {request_id}: {ids}")
        with self._lock:
            if request_id in self._reservations:
                raise ValueError(f"request {request_id} is already expected")
            self._forgotten.pop(request_id, None)
            self._reservations[request_id] = _Reservation(ids)

    def forget(self, request_id: str, on_released: Callable[[], None] | None = None) -> bool:
        with self._lock:
            res = self._reservations.pop(request_id, None)
            if res is None:
                return True
            self._forgotten[request_id] = None
            while len(self._forgotten) > _FORGOTTEN_MEMORY:
                self._forgotten.popitem(last=False)
        with res.lock:  # waits for a write in progress
            res.forgotten = True
            writer = res.writer
            if writer is None or writer.done:
                return True
            res.on_released = on_released
        writer.notify()
        return False

    def attach(self, request_id: str, block_ids: Sequence[int], notify: Callable[[], None]) -> Writer:
        """Attach a peer that will write the reservation's blocks itself. Raises ChunkRejected:
        NOT_FOUND (unknown or forgotten), INVALID_ARGUMENT (other blocks, or already complete),
        ALREADY_EXISTS (a writer is attached)."""
        res = self._lookup(request_id)
        with res.lock:
            if res.forgotten:
                raise _forgotten_error(request_id)
            if tuple(int(b) for b in block_ids) != res.block_ids:
                raise ChunkRejected(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"block_ids: {list(block_ids)} are not the blocks reserved for {request_id}",
                )
            if res.complete:
                raise ChunkRejected(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"request {request_id} is already complete")
            if res.writer is not None:
                raise ChunkRejected(grpc.StatusCode.ALREADY_EXISTS,
                                    f"request {request_id} already has a writer")
            res.writer = Writer(res, notify)
            return res.writer

    def release_writer(self, writer: Writer, *, lost: bool) -> None:
        """The writer's last write has landed (`lost`=False: it said so), or its connection
        broke (`lost`=True: it is taken as done after the grace period, enough for a dead
        process's queued copies to be torn down). Frees a forgotten reservation's blocks."""
        if lost:
            timer = threading.Timer(self._writer_grace_s, self.release_writer, (writer,),
                                    {"lost": False})
            timer.daemon = True
            timer.start()
            return
        res = writer.reservation
        with res.lock:
            writer.done = True
            callback, res.on_released = res.on_released, None
        if callback is not None:
            callback()

    def writer_attached(self, request_id: str) -> bool:
        """True while a direct writer (cuda_ipc) is attached to the reservation."""
        res = self._lookup(request_id)
        with res.lock:
            return res.writer is not None and not res.writer.done

    def received_bytes(self, request_id: str) -> int:
        with self._lock:
            return self._reservations[request_id].bytes

    def is_complete(self, request_id: str) -> bool:
        with self._lock:
            return self._reservations[request_id].complete

    def apply(self, chunk: kv_pb2.KvChunk) -> kv_pb2.PushAck | None:
        """Validate and write one chunk; return the PushAck after the last one.
        Raises ChunkRejected (nothing written) when the chunk may not be applied."""
        return self._apply(
            chunk, len(chunk.data), lambda dst: self._write(chunk.layer, dst, chunk.data)
        )

    def apply_tensor(
        self, header: kv_pb2.KvChunk, data: torch.Tensor | None
    ) -> kv_pb2.PushAck | None:
        """Like apply(), for a payload that travelled as a uint8 tensor (`header.data` empty;
        None for the last chunk). The tensor is a scratch buffer, never the pool."""
        size = 0 if data is None else data.numel()
        return self._apply(
            header, size, lambda dst: self._write_tensor(header.layer, dst, data)
        )

    def account(self, header: kv_pb2.KvChunk, data_len: int) -> kv_pb2.PushAck | None:
        """Validate and count a chunk whose payload the peer wrote itself (cuda_ipc)."""
        return self._apply(header, data_len, None)

    def _apply(
        self,
        chunk: kv_pb2.KvChunk,
        data_len: int,
        write: Callable[[tuple[int, ...]], None] | None,
    ) -> kv_pb2.PushAck | None:
        res = self._lookup(chunk.request_id)
        with res.lock:
            if res.forgotten:
                raise _forgotten_error(chunk.request_id)
            if res.complete:
                raise ChunkRejected(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request {chunk.request_id} already received its last chunk",
                )
            dst = check_chunk(chunk, self.layout, res.block_ids, data_len)
            if dst and write is not None:
                write(dst)
            res.bytes += data_len
            res.chunks += 1
            self._debug.applied(chunk, res.bytes)
            if not chunk.last:
                return None
            res.complete = True
            if res.writer is not None:  # a direct writer synchronises before its last chunk
                res.writer.done = True
            ack = kv_pb2.PushAck(bytes=res.bytes, chunks=res.chunks)
        if self._on_complete is not None:
            self._on_complete(chunk.request_id)
        return ack

    def _lookup(self, request_id: str) -> _Reservation:
        with self._lock:
            res = self._reservations.get(request_id)
            if res is not None:
                return res
            if request_id in self._forgotten:
                raise _forgotten_error(request_id)
        raise ChunkRejected(grpc.StatusCode.NOT_FOUND, f"request {request_id!r} is not expected")

    def _write(self, layer: int, dst: tuple[int, ...], data: bytes) -> None:
        # bytearray: torch.frombuffer warns on read-only buffers such as protobuf bytes.
        self._write_tensor(layer, dst, torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def _write_tensor(self, layer: int, dst: tuple[int, ...], data: torch.Tensor | None) -> None:
        if data is None:
            raise ChunkRejected(grpc.StatusCode.INVALID_ARGUMENT, "chunk without data")
        shape = (2, len(dst), *self._pool.shape[3:])
        src = data.view(self._dtype).view(shape)
        index = torch.tensor(dst, dtype=torch.long, device=self._pool.device)
        self._pool[layer][:, index] = src.to(self._pool.device)
        if self._pool.is_cuda:  # visible before the ack
            torch.cuda.current_stream(self._pool.device).synchronize()


def _forgotten_error(request_id: str) -> ChunkRejected:
    return ChunkRejected(
        grpc.StatusCode.NOT_FOUND,
        f"request {request_id!r} was forgotten (aborted or lease expired)",
    )
