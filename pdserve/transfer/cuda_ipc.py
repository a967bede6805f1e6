"""cuda_ipc backend: the prefill worker writes straight into the decode worker's pool.

The decode worker exports its pool's CUDA IPC handle once, in the KvTransfer Handshake reply
(`pool_export`, JSON: no pickle). The prefill worker maps it once per decode address and, per
push, copies the request's blocks of one layer with one block-copy kernel on a dedicated
stream that overlaps the following layers; the engine's stream waits for the copies after the
last layer, so a later step cannot overwrite a source block before it was read. The KvTransfer Push stream carries only metadata KvChunks (no data; the
decode side validates them against the reservation and counts bytes) and, after the copy
stream is synchronised in finish(), the last chunk: the write is visible before the decode
side marks the request complete and before finish() reports success.

No silent fallback: a pool not on CUDA, a peer in another PID namespace, a peer GPU not
visible here, or a failing cudaIpcOpenMemHandle raise CudaIpcUnavailable with the reason.

Abort ordering (_attach.py): copies already queued on the copy stream land after the CPU has
moved on, so the decode side must not free a forgotten request's blocks on its own. The sender
attaches to the reservation before its first copy; on failure, abort, or the receiver's
`forgotten` event it stops queueing copies, synchronises the copy stream and only then
releases; the decode side frees the blocks on that release (or a grace period after the
sender's call broke).
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
from pdserve.transfer._attach import DirectWriteReceiver, WriterLink
from pdserve.transfer._wire import block_bytes, torch_dtype
from pdserve.transfer.base import (
    KvTargetSpec, LayoutMismatch, TransferError, TransferState, layout_from_proto,
    layout_to_proto, mismatch_message,
)
from pdserve.transfer.tcp import TcpKvSender, _TcpSendHandle, _rpc_error


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

    def __init__(self, layout: KvLayout, **kw: Any) -> None:
        super().__init__(layout, **kw)
        self._mapped: dict[str, torch.Tensor] = {}
        self._copiers: dict[torch.device, CudaCopier] = {}  # one copy stream per device, shared
        self._copier_lock = threading.Lock()  # not _map_lock: _remote() calls _copier() under it
        self._map_lock = threading.Lock()

    def start(self, target: KvTargetSpec, kv_pool: torch.Tensor) -> _IpcSendHandle:
        if not kv_pool.is_cuda:
            raise CudaIpcUnavailable(f"cuda_ipc needs the KV pool on a CUDA device; it is on {kv_pool.device}")
        stub = kv_pb2_grpc.KvTransferStub(self._channel(target.address))
        remote = self._remote(target.address, stub)
        if target.layout_hash != self.layout.compat_hash():
            raise LayoutMismatch(f"target names layout hash {target.layout_hash}, mine is "
                                 f"{self.layout.compat_hash()} [{self.layout.describe()}]")
        if any(not 0 <= b < remote.shape[2] for b in target.block_ids):
            raise ValueError(f"target blocks outside the decode pool of {remote.shape[2]} blocks")
        return _IpcSendHandle(target, kv_pool, self.layout, stub, self._call_timeout, remote,
                              self._copier(kv_pool.device), self._handshake_timeout)

    def _copier(self, device: torch.device) -> CudaCopier:
        """The device's copier. One stream for every handle: a new stream per request would
        make its first allocation a cudaMalloc, which waits for the whole device."""
        with self._copier_lock:
            if device not in self._copiers:
                self._copiers[device] = CudaCopier(device)
            return self._copiers[device]

    def close(self) -> None:
        """Unmap the peers' pools and close the channels."""
        with self._map_lock:
            self._mapped.clear()
        super().close()

    def _remote(self, address: str, stub: kv_pb2_grpc.KvTransferStub) -> torch.Tensor:
        with self._map_lock:
            if address in self._mapped:
                return self._mapped[address]
            try:
                reply = stub.Handshake(layout_to_proto(self.layout), timeout=self._handshake_timeout)
            except grpc.RpcError as err:
                raise _rpc_error(err) from None
            peer = layout_from_proto(reply.layout)
            if peer.compat_hash() != self.layout.compat_hash():
                raise LayoutMismatch(mismatch_message(self.layout, peer))
            remote = map_pool(reply.pool_export, self.layout)
            self._copier(remote.device).warm_up(remote)
            self._mapped[address] = remote
            return remote


class Copier(Protocol):
    """Queues copies from the local pool into the peer's pool; synchronize() returns once
    every queued copy has landed."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor, layer: int, src_ids: Sequence[int],
             dst_ids: Sequence[int]) -> None: ...

    def synchronize(self) -> None: ...


_ID_CACHE = 256  # block-id sets kept on the device (each request step pushes one per layer)


class CudaCopier:
    """One block-copy kernel per push (kernels/copy_blocks.py) on a dedicated stream, ordered
    after the engine's stream (the layer was written there). The engine's stream waits for the
    copies only after the pool's last layer was pushed: the copies overlap the next layers'
    compute, and no later kernel (a reuse of the source blocks by the next step) can run
    before they read their source."""

    def __init__(self, device: torch.device) -> None:
        from kernels.copy_blocks import copy_blocks  # Triton: imported only where CUDA runs

        self._copy_blocks = copy_blocks
        self._device = device
        self._stream = torch.cuda.Stream(device=device)
        self._ids: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}  # FIFO, bounded
        self._lock = threading.Lock()  # handles of several requests push from the engine thread

    def copy(self, dst: torch.Tensor, src: torch.Tensor, layer: int, src_ids: Sequence[int],
             dst_ids: Sequence[int]) -> None:
        ids = self._device_ids(tuple(src_ids), tuple(dst_ids))
        current = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            if dst.device == src.device:
                self._copy_blocks(src[layer], dst[layer], ids[0], ids[1])
            else:  # a peer GPU's pool: gather here, then one peer-to-peer copy (untested: 1 GPU)
                raw = src[layer].index_select(1, ids[0].long())
                dst[layer].index_copy_(1, ids[1].to(dst.device).long(), raw.to(dst.device))
        if layer == src.shape[0] - 1:
            current.wait_stream(self._stream)

    def _device_ids(self, src_ids: tuple[int, ...], dst_ids: tuple[int, ...]) -> torch.Tensor:
        """[2, n] int32 ids on the device, uploaded once per block set (every layer reuses
        them). The upload is queued on the copy stream before it waits for the engine's
        stream, so the host does not wait for the forward."""
        key = (src_ids, dst_ids)
        with self._lock:
            ids = self._ids.get(key)
            if ids is None:
                with torch.cuda.stream(self._stream):
                    ids = torch.tensor([src_ids, dst_ids], dtype=torch.int32, device=self._device)
                self._ids[key] = ids
                if len(self._ids) > _ID_CACHE:  # freed in stream order: a queued copy keeps it
                    del self._ids[next(iter(self._ids))]
        return ids

    def warm_up(self, pool: torch.Tensor) -> None:
        """Compile the block-copy kernel for this pool's block shape and give the copy stream
        its first memory segment now, not in the first push (a cudaMalloc waits for the device)."""
        with torch.cuda.stream(self._stream):
            scratch = torch.zeros((2, 2, *pool.shape[3:]), dtype=pool.dtype, device=pool.device)
            ids = torch.tensor([0], dtype=torch.int32, device=pool.device)
            self._copy_blocks(scratch, scratch, ids, ids + 1)

    def synchronize(self) -> None:
        self._stream.synchronize()


class _IpcSendHandle(_TcpSendHandle):
    """Attached writer: copies through a Copier; the Push stream carries metadata and the
    final chunk. A failed or aborted handle queues no further copy, synchronises the copier
    and then releases the reservation (on its own thread: the sync may wait for a forward)."""

    def __init__(self, target: KvTargetSpec, kv_pool: torch.Tensor, layout: KvLayout,
                 stub: kv_pb2_grpc.KvTransferStub, call_timeout: float, remote: torch.Tensor,
                 copier: Copier, attach_timeout: float) -> None:
        # Before super(): the Push call's failure callback may run _fail at once.
        self._copy_lock = threading.Lock()  # held while a copy is queued; the release waits on it
        self._stopping = False
        self._link: WriterLink | None = None
        self._link_ready = threading.Event()  # set once the link exists (None: never sent)
        self._attached = False  # the receiver accepted this writer (checked before the first copy)
        self._attach_timeout = attach_timeout
        super().__init__(target, kv_pool, layout, 1 << 30, stub, call_timeout, on_mismatch=lambda: None)
        self._remote = remote
        self._copier = copier
        self._block_bytes = block_bytes(layout)
        link = WriterLink(stub, target.request_id, target.block_ids, self._hash,
                          call_timeout=call_timeout, on_lost=self._fail)
        try:
            link.begin()  # answered while the first layer computes; awaited before the first copy
            self._link = link
        except Exception:
            self._cancel()
            raise
        finally:
            self._link_ready.set()

    def _encode(self, layer: int, src_block_ids: Sequence[int], dst_block_offset: int
                ) -> list[tuple[Any, int]]:
        num_layers, _, num_blocks = self._pool.shape[:3]
        if not 0 <= layer < num_layers or any(not 0 <= b < num_blocks for b in src_block_ids):
            raise ValueError(f"layer {layer} or source blocks {list(src_block_ids)} out of range")
        dst = self._target.block_ids[dst_block_offset : dst_block_offset + len(src_block_ids)]
        with self._copy_lock:
            if self._state.final:  # failed or aborted: the release may already be under way
                return []
            if not self._attached:
                try:
                    self._link.wait_attached(self._attach_timeout)  # no write before the yes
                except TransferError as err:
                    refused = err
                else:
                    refused = None
                    self._attached = True
            if self._attached:
                self._copier.copy(self._remote, self._pool, layer, src_block_ids, dst)
        if not self._attached:
            self._fail(refused)
            return []
        meta = kv_pb2.KvChunk(request_id=self._target.request_id, layout_hash=self._hash,
                              layer=layer, block_offset=dst_block_offset,
                              num_blocks=len(src_block_ids))
        return [(meta, len(src_block_ids) * self._block_bytes)]

    def drain(self) -> None:
        """Block until every copy queued so far has landed (benchmarks; finish() does it too)."""
        self._copier.synchronize()

    def _complete(self, last: kv_pb2.KvChunk, timeout: float) -> kv_pb2.PushAck:
        if not self._attached:  # nothing was pushed (e.g. the decode side cached every block)
            self._link.wait_attached(self._attach_timeout)
            self._attached = True
        self._copier.synchronize()  # every write is done and visible before the last chunk
        ack = super()._complete(last, timeout)
        if self._link is not None:
            self._link.release()
        return ack

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
        self._link_ready.wait()
        with self._copy_lock:  # a copy being queued right now goes in before the sync
            self._copier.synchronize()
        if self._link is not None:
            self._link.release()
