"""cuda_ipc backend: the prefill worker writes straight into the decode worker's pool.

The decode worker exports its pool's CUDA IPC handle once, in the KvTransfer Handshake reply
(`pool_export`, JSON: no pickle). The prefill worker maps it once per decode address and, per
push, copies the request's blocks of one layer with one block-copy kernel on a dedicated
stream that overlaps the following layers; the engine's stream waits for the copies after the
last layer, so a later step cannot overwrite a source block before it was read. Control
messages (attach, the metadata summary of the writes, the last chunk, release) travel on one
long-lived KvTransfer Control stream per decode worker; after the copy stream is synchronised
(seal) the summary and the last chunk go out: the bytes are visible before the prefill worker
answers, and the decode side counts them before it marks the request complete.

No silent fallback: a pool not on CUDA, a peer in another PID namespace, a peer GPU not
visible here, or a failing cudaIpcOpenMemHandle raise CudaIpcUnavailable with the reason.

Abort ordering (_attach.py): copies already queued on the copy stream land after the CPU has
moved on, so the decode side must not free a forgotten request's blocks on its own. The sender
attaches to the reservation before its first copy; on failure, abort, or the receiver's
`forgotten` event it stops queueing copies, synchronises the copy stream and only then
releases; the decode side frees the blocks on that release (or a grace period after the
sender's Control stream broke).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import grpc
import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2, kv_pb2_grpc
from pdserve.transfer._attach import ControlLink, DirectWriteReceiver, WriterLink
from pdserve.transfer._wire import block_bytes, torch_dtype
from pdserve.transfer.base import (
    KvTargetSpec, LayoutMismatch, TransferError, TransferState, layout_from_proto,
    layout_to_proto, mismatch_message,
)
from pdserve.transfer._handle import ChunkSendHandle
from pdserve.transfer.tcp import TcpKvSender, _rpc_error


def _written(pool: torch.Tensor) -> torch.cuda.Event | None:
    """An event after the work queued so far on the engine's stream (None off CUDA: tests)."""
    if not pool.is_cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(pool.device))
    return event


class CudaIpcUnavailable(RuntimeError):
    """CUDA IPC cannot work between these two workers; the message says why."""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "unknown"


def export_pool(pool: torch.Tensor) -> bytes:
    """The JSON export of a CUDA pool's IPC handle (the storage is shared once)."""
    if not pool.is_cuda:
        raise CudaIpcUnavailable(f"cuda_ipc needs the KV pool on a CUDA device; it is on {pool.device}")
    (device, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync) = (
        pool.untyped_storage()._share_cuda_()
    )
    return json.dumps({
        "device": device, "handle": handle.hex(), "size": size, "offset": offset,
        "ref_handle": ref_handle.hex(), "ref_offset": ref_offset,
        "event_handle": event_handle.hex(), "event_sync": bool(event_sync),
        "shape": list(pool.shape), "stride": list(pool.stride()),
        "storage_offset": pool.storage_offset(), "dtype": str(pool.dtype),
        "uuid": str(torch.cuda.get_device_properties(pool.device).uuid),
        "pid_ns": _pid_namespace(),
    }).encode()


def _local_device(uuid: str) -> int:
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise CudaIpcUnavailable(f"the decode worker's GPU {uuid} is not visible here "
                             f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")


def map_pool(raw: bytes, layout: KvLayout) -> torch.Tensor:
    """Map a peer's exported pool; CudaIpcUnavailable with the reason when impossible."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if not raw:
        raise CudaIpcUnavailable("the decode worker exported no pool (is it running --kv-transfer cuda_ipc?)")
    exp = json.loads(raw)
    if exp["pid_ns"] != _pid_namespace():
        raise CudaIpcUnavailable(f"decode worker is in PID namespace {exp['pid_ns']}, this one in "
                                 f"{_pid_namespace()}: CUDA IPC needs one (share --pid=host)")
    if not torch.cuda.is_available():
        raise CudaIpcUnavailable("no CUDA device is visible to this worker")
    device = _local_device(exp["uuid"])
    if str(torch_dtype(layout)) != exp["dtype"]:
        raise CudaIpcUnavailable(f"exported pool dtype {exp['dtype']} != layout {layout.dtype}")
    try:
        return rebuild_cuda_tensor(
            torch.Tensor, tuple(exp["shape"]), tuple(exp["stride"]), exp["storage_offset"],
            torch.UntypedStorage, torch_dtype(layout), device, bytes.fromhex(exp["handle"]),
            exp["size"], exp["offset"], False, bytes.fromhex(exp["ref_handle"]),
            exp["ref_offset"], bytes.fromhex(exp["event_handle"]), exp["event_sync"],
        )
    except RuntimeError as err:
        raise CudaIpcUnavailable(f"cudaIpcOpenMemHandle failed: {err}") from None


class CudaIpcKvReceiver(DirectWriteReceiver):
    """Decode side: exports the pool at construction (refuses a non-CUDA pool), accepts
    metadata-only chunks on Push and attached writers on Attach."""

    def __init__(self, kv_pool: torch.Tensor, layout: KvLayout, **kw: Any) -> None:
        self._export = export_pool(kv_pool)
        super().__init__(kv_pool, layout, **kw)

    async def Handshake(self, request: kv_pb2.KvLayout, context: grpc.aio.ServicerContext
                        ) -> kv_pb2.HandshakeReply:
        reply = await super().Handshake(request, context)
        reply.pool_export = self._export
        return reply


class CudaIpcKvSender(TcpKvSender):
    """Prefill side: maps each decode worker's pool once, then copies GPU to GPU."""

    def __init__(self, layout: KvLayout, *, attach_at_start: bool = True, **kw: Any) -> None:
        """A request's attach goes out at start(): its answer comes back while the prompt is
        queued or its first layers are enqueued, so fewer pushes wait for it (_on_answer).
        attach_at_start=False sends it with the first push instead: on an H200 that added 2.1 %
        to a 2k-token TTFT against 1.1 % (8k: 0.4 against 0.1 %; runs in rotating order,
        bench/transfer.py --late-attach, bench/results/transfer-h200-2026-12-04-s9c.json)."""
        super().__init__(layout, **kw)
        self._attach_at_start = attach_at_start
        self._mapped: dict[str, torch.Tensor] = {}
        self._links: dict[str, ControlLink] = {}  # one Control stream per decode worker
        self._copiers: dict[torch.device, CudaCopier] = {}  # one copy stream per device, shared
        self._copier_lock = threading.Lock()
        self._map_lock = threading.Lock()

    def start(self, target: KvTargetSpec, kv_pool: torch.Tensor) -> _IpcSendHandle:
        if not kv_pool.is_cuda:
            raise CudaIpcUnavailable(f"cuda_ipc needs the KV pool on a CUDA device; it is on {kv_pool.device}")
        stub = kv_pb2_grpc.KvTransferStub(self._channel(target.address))
        remote, link = self._peer(target.address, stub)
        if target.layout_hash != self.layout.compat_hash():
            raise LayoutMismatch(f"target names layout hash {target.layout_hash}, mine is "
                                 f"{self.layout.compat_hash()} [{self.layout.describe()}]")
        ids = target.block_ids
        if ids and not (min(ids) >= 0 and max(ids) < remote.shape[2]):
            raise ValueError(f"target blocks outside the decode pool of {remote.shape[2]} blocks")
        copier = self._copier(kv_pool.device)
        copier.prepare(kv_pool, remote)
        handle = _IpcSendHandle(target, kv_pool, self.layout, link, remote, copier, self._handshake_timeout)
        if self._attach_at_start:  # else the first push sends it (_begin is idempotent)
            handle._begin()
        return handle

    def _copier(self, device: torch.device) -> CudaCopier:
        """The device's copier. One stream for every handle: a new stream per request would
        make its first allocation a cudaMalloc, which waits for the whole device."""
        with self._copier_lock:
            if device not in self._copiers:
                self._copiers[device] = CudaCopier(device)
            return self._copiers[device]

    def close(self) -> None:
        """Close the Control streams, unmap the peers' pools and close the channels."""
        with self._map_lock:
            for link in self._links.values():
                link.close()
            self._links.clear()
            self._mapped.clear()
        super().close()

    def _peer(self, address: str, stub: kv_pb2_grpc.KvTransferStub) -> tuple[torch.Tensor, ControlLink]:
        """The decode worker's mapped pool and its Control stream, made together on first use.
        A stream that broke means the decode worker went away and may be a new process now:
        its pool is handshaken and mapped again with the new stream (writing through the old
        mapping would land in the dead process's memory, never in the new pool)."""
        with self._map_lock:
            link = self._links.get(address)
            if link is not None and link.alive and address in self._mapped:
                return self._mapped[address], link
            self._mapped.pop(address, None)
            try:
                reply = stub.Handshake(layout_to_proto(self.layout), timeout=self._handshake_timeout)
            except grpc.RpcError as err:
                raise _rpc_error(err) from None
            peer = layout_from_proto(reply.layout)
            if peer.compat_hash() != self.layout.compat_hash():
                raise LayoutMismatch(mismatch_message(self.layout, peer))
            self._mapped[address] = map_pool(reply.pool_export, self.layout)
            self._links[address] = ControlLink(stub)
            return self._mapped[address], self._links[address]


class Copier(Protocol):
    """Queues copies from the local pool into the peer's pool; synchronize() returns once
    every queued copy has landed. `layer` None copies every layer at once. A copy runs after
    the work queued so far on the calling thread's current stream, or, from another thread,
    after the `after` event (recorded on the engine's stream when the layer was written)."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor, layer: int | None, src_ids: Sequence[int],
             dst_ids: Sequence[int], after: Any = None) -> None: ...

    def synchronize(self) -> None: ...


_ID_CACHE = 256  # block-id sets kept on the device (each request step pushes one per layer)
_ID_ALIGN = 4  # int32s per 16 bytes: both id rows start 16-byte aligned (one kernel variant)


class CudaCopier:
    """One block-copy kernel per push (pdserve/kernels/copy_blocks.py) on a dedicated stream, ordered
    after the engine's stream (the layer was written there). The engine's stream waits for the
    copies only after the pool's last layer (or all layers at once) was pushed: the copies
    overlap the next layers' compute, and no later kernel (a reuse of the source blocks by the
    next step) can run before they read their source.

    Nothing here waits for the device: block ids go up from pinned memory without a sync, and
    both id rows are 16-byte aligned so every push runs the kernel variant compiled (and
    loaded: a module load waits for the whole device) by warm_up."""

    def __init__(self, device: torch.device) -> None:
        from pdserve.kernels.copy_blocks import PoolCopy  # Triton: imported only where CUDA runs

        self._pool_copy = PoolCopy
        self._device = device
        self._stream = torch.cuda.Stream(device=device)
        self._plans: dict[tuple[int, int], Any] = {}  # (src, dst) data pointers -> PoolCopy
        self._ids: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}  # FIFO, bounded
        self._last: tuple[Sequence[int], Sequence[int], torch.Tensor] | None = None
        self._lock = threading.Lock()  # handles of several requests push from the engine thread

    def copy(self, dst: torch.Tensor, src: torch.Tensor, layer: int | None, src_ids: Sequence[int],
             dst_ids: Sequence[int], after: torch.cuda.Event | None = None) -> None:
        ids = self._device_ids(src_ids, dst_ids)
        current = torch.cuda.current_stream(self._device)
        if after is None:
            self._stream.wait_stream(current)
        else:  # queued late, from the attach thread: after the engine wrote the layer
            self._stream.wait_event(after)
        n = len(src_ids)
        with torch.cuda.stream(self._stream):
            if dst.device == src.device:
                self._plan(src, dst)(ids[0, :n], ids[1, :n], layer)
            else:  # a peer GPU's pool: gather here, then one peer-to-peer copy (untested: 1 GPU)
                layers = slice(None) if layer is None else slice(layer, layer + 1)
                raw = src[layers].index_select(2, ids[0, :n].long())
                dst[layers].index_copy_(2, ids[1, :n].to(dst.device).long(), raw.to(dst.device))
        if after is None and (layer is None or layer == src.shape[0] - 1):
            current.wait_stream(self._stream)

    @property
    def stream(self) -> torch.cuda.Stream:
        return self._stream

    def _plan(self, src: torch.Tensor, dst: torch.Tensor) -> Any:
        plan = self._plans.get((src.data_ptr(), dst.data_ptr()))
        if plan is None:  # a pair start() did not prepare
            self.prepare(src, dst)
            plan = self._plans[(src.data_ptr(), dst.data_ptr())]
        return plan

    def _device_ids(self, src_ids: Sequence[int], dst_ids: Sequence[int]) -> torch.Tensor:
        """[2, n rounded up to 4] int32 ids on the device, uploaded once per block set (every
        layer reuses them; the same sequence objects skip even the lookup)."""
        last = self._last
        if last is not None and last[0] is src_ids and last[1] is dst_ids:
            return last[2]
        key = (tuple(src_ids), tuple(dst_ids))
        with self._lock:
            ids = self._ids.get(key)
            if ids is None:
                n = len(key[0])
                host = torch.zeros((2, -(-n // _ID_ALIGN) * _ID_ALIGN), dtype=torch.int32, pin_memory=True)
                host[0, :n] = torch.tensor(key[0], dtype=torch.int32)
                host[1, :n] = torch.tensor(key[1], dtype=torch.int32)
                with torch.cuda.stream(self._stream):  # in stream order; pinned: no host sync
                    ids = host.to(self._device, non_blocking=True)
                self._ids[key] = ids
                if len(self._ids) > _ID_CACHE:  # freed in stream order: a queued copy keeps it
                    del self._ids[next(iter(self._ids))]
            self._last = (src_ids, dst_ids, ids)
        return ids

    def prepare(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Check the pool pair and compile and load its kernel variant, and give the copy stream
        its first memory segment, now (once per pair), not in a push (both wait for the device)."""
        key = (src.data_ptr(), dst.data_ptr())
        with self._lock:
            if key in self._plans or src.device != dst.device:
                return
            plan = self._pool_copy(src, dst)
            with torch.cuda.stream(self._stream):
                torch.empty(1 << 20, dtype=torch.uint8, device=self._device)
                plan.warm_up()
            self._stream.synchronize()
            self._plans[key] = plan

    def synchronize(self) -> None:
        self._stream.synchronize()


class _IpcSendHandle(ChunkSendHandle):
    """Attached writer: copies through a Copier; no data on the wire, and no call of its own:
    its messages travel on the sender's Control stream to the receiver (_attach.py).

    The engine thread never waits for the network before the pool's last layer: the first push
    sends the attach and returns; the pushes made before the receiver's yes are kept, each with
    an event recorded on the engine's stream, and queued when the yes arrives (no write before
    it). A push of the last layer, or of every layer at once, waits for the yes if it has not
    come: the engine's stream then waits for every copy, so a later step cannot reuse a source
    block before it was read. Each push's metadata is folded into a summary (one KvChunk per
    run of layers over the same blocks, `num_layers`); seal() synchronises the copier, sends the
    summary and the last chunk, and releases the writer; finish() waits for the receiver's check
    and count (the ack). A failed or aborted handle queues no further copy, synchronises the
    copier and then releases the reservation (on its own thread: the sync may wait for a
    forward)."""

    _all_layers_at_once = True

    def __init__(self, target: KvTargetSpec, kv_pool: torch.Tensor, layout: KvLayout,
                 control: ControlLink, remote: torch.Tensor, copier: Copier, attach_timeout: float) -> None:
        self._copy_lock = threading.Lock()  # held while a copy is queued; the release waits on it
        self._stopping = False
        self._link: WriterLink | None = None
        self._answered = threading.Event()  # set once the attach was answered (or failed)
        self._sent = threading.Event()  # the attach is on the stream (a release must follow it)
        self._yes = False  # the receiver accepted this writer
        self._attached = False  # copies go to the copier at once (guarded by _copy_lock)
        self._kept: list[tuple[int | None, Sequence[int], Sequence[int], Any]] = []  # before the yes
        self._attach_timeout = attach_timeout
        super().__init__(target, kv_pool, layout, 1 << 30)
        self._control = control
        self._remote = remote
        self._copier = copier
        self._block_bytes = block_bytes(layout)
        self._summary: list[kv_pb2.KvChunk] = []
        self._blocks: tuple[Sequence[int], int, Sequence[int]] | None = None  # last checked (src, offset, dst)
        self._opening = False  # the attach was sent or will never be (guarded by _lock)

    def _begin(self) -> None:
        """Send the attach (once; never after a failure or abort). Not under _copy_lock: the
        answer may come at once (a stream already down) and takes it."""
        with self._lock:
            first = not self._opening and not self._state.final
            self._opening = True
            if first:
                self._link = WriterLink(self._control, self._target.request_id, self._target.block_ids,
                                        self._hash, on_answer=self._on_answer, on_lost=self._fail)
        if not first:
            return
        try:
            self._link.begin()
        finally:
            self._sent.set()

    def _on_answer(self, err: TransferError | None) -> None:
        """The receiver's yes (None) or no (the kept copies are dropped). After a yes the kept
        copies are queued by the engine thread's next push, seal or drain, not from this
        (the Control reader) thread: launching them here while the engine thread launched the
        forward added 2-3 % to a 2k prefill on the H200 (`ipc_probe variants`, 2026-12-03:
        pushes whose kept copies were no-ops, or launched on the engine thread, cost nothing)."""
        if err is None:
            self._yes = True
        else:
            self._fail(err)
        self._answered.set()
        if err is not None:
            with self._copy_lock:
                self._release_kept()  # drops them

    def _release_kept(self) -> None:
        """Under _copy_lock: once attached, queue the kept copies (dropped after a failure)."""
        if self._attached or not self._answered.is_set():
            return
        if self._state.final or not self._yes:
            self._kept.clear()
            return
        for layer, src, dst, written in self._kept:
            self._copier.copy(self._remote, self._pool, layer, src, dst, after=written)
        self._kept.clear()
        self._attached = True

    def _await_attach(self) -> bool:
        """Under _copy_lock, after _begin(): wait for the yes and queue the kept copies; False
        if refused."""
        if not self._answered.wait(self._attach_timeout):
            self._fail(TransferError(f"KV attach not answered within {self._attach_timeout}s",
                                     retryable=True, code="DEADLINE_EXCEEDED"))
        self._release_kept()
        return self._attached

    def _encode(self, layer: int | None, src_block_ids: Sequence[int], dst_block_offset: int
                ) -> list[tuple[Any, int]]:
        num_layers = self._pool.shape[0]
        if layer is not None and not 0 <= layer < num_layers:
            raise ValueError(f"layer {layer} out of range [0, {num_layers})")
        dst = self._checked(src_block_ids, dst_block_offset)
        if not self._attached:
            self._begin()
        with self._copy_lock:
            if self._state.final:  # failed or aborted: the release may already be under way
                return []
            if not self._attached and self._answered.is_set():
                self._release_kept()  # the yes came: queue the kept copies here, on the engine thread
            if not self._attached and layer is not None and layer < num_layers - 1:
                self._kept.append((layer, src_block_ids, dst, _written(self._pool)))
            elif self._attached or self._await_attach():
                self._copier.copy(self._remote, self._pool, layer, src_block_ids, dst)
            else:
                return []
        layers = num_layers if layer is None else 1
        meta = kv_pb2.KvChunk(request_id=self._target.request_id, layout_hash=self._hash,
                              layer=layer or 0, block_offset=dst_block_offset,
                              num_blocks=len(src_block_ids), num_layers=layers)
        return [(meta, layers * len(src_block_ids) * self._block_bytes)]

    def _checked(self, src_block_ids: Sequence[int], dst_block_offset: int) -> Sequence[int]:
        """The target blocks of a push; the source ids are range-checked once per block set
        (every layer of a step pushes the same one)."""
        last = self._blocks
        if last is not None and last[1] == dst_block_offset and (
                last[0] is src_block_ids or last[0] == src_block_ids):
            return last[2]
        num_blocks = self._pool.shape[2]
        if src_block_ids and not (0 <= min(src_block_ids) and max(src_block_ids) < num_blocks):
            raise ValueError(f"source blocks {list(src_block_ids)} outside the pool of {num_blocks} blocks")
        dst = self._target.block_ids[dst_block_offset : dst_block_offset + len(src_block_ids)]
        self._blocks = (src_block_ids, dst_block_offset, dst)
        return dst

    def _send(self, chunk: kv_pb2.KvChunk) -> None:
        """Fold a push's metadata into the summary: the next layer of the same blocks extends it."""
        prev = self._summary[-1] if self._summary else None
        if (prev is not None and prev.block_offset == chunk.block_offset and prev.num_blocks == chunk.num_blocks
                and chunk.layer == prev.layer + prev.num_layers):
            prev.num_layers += chunk.num_layers
        else:
            self._summary.append(chunk)

    @property
    def copy_stream(self) -> torch.cuda.Stream | None:
        """The stream the copies run on, None for a copier without one (benchmarks time it)."""
        return getattr(self._copier, "stream", None)

    def drain(self) -> None:
        """Block until every push so far has landed (benchmarks; seal() does it too), kept
        pushes included: they wait for the attach answer first."""
        with self._copy_lock:
            if not self._attached and self._kept:
                self._await_attach()
        self._copier.synchronize()

    def _seal(self, last: kv_pb2.KvChunk, timeout: float) -> None:
        """Every copy landed (so the bytes are visible to the decode worker): send the summary
        and the last chunk, and release the writer; finish() waits for the ack."""
        self._begin()  # nothing pushed (the decode side had every block): still attach
        with self._copy_lock:
            attached = self._attached or self._await_attach()
        if not attached:
            raise self._error or TransferError("KV transfer failed", retryable=True, code="UNAVAILABLE")
        self._copier.synchronize()
        self._link.send_summary(self._summary, last)
        self._link.release()

    def _acknowledged(self, timeout: float) -> kv_pb2.PushAck:
        try:
            return self._link.wait_ack(timeout)
        finally:
            self._link.close()

    def _complete(self, last: kv_pb2.KvChunk, timeout: float) -> kv_pb2.PushAck:
        self._seal(last, timeout)
        return self._acknowledged(timeout)

    def _cancel(self) -> None:
        pass  # abort() -> _stop_writing() releases once queued copies landed

    def _fail(self, err: TransferError) -> None:
        super()._fail(err)
        self._stop_writing()

    def abort(self) -> None:
        super().abort()
        self._stop_writing()

    def _stop_writing(self) -> None:
        with self._lock:
            if self._stopping or self._state not in (TransferState.FAILED, TransferState.ABORTED):
                return
            self._stopping = True
        threading.Thread(target=self._drain_and_release, name="kv-ipc-release", daemon=True).start()

    def _drain_and_release(self) -> None:
        with self._lock:
            opened, self._opening = self._opening, True  # from now on nothing is sent
        if not opened:  # no attach, no copy: nothing to wait for
            self._answered.set()
            return
        self._sent.wait()
        with self._copy_lock:  # a copy being queued right now goes in before the sync
            self._copier.synchronize()
        self._link.release()
        self._link.close()
