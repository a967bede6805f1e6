"""Prefill side of one nccl pair: rendezvous, the FIFO sender thread and the ack thread."""

from __future__ import annotations

import logging
import queue
import threading
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2
from pdserve.transfer import _p2p
from pdserve.transfer._p2p import Ack, Kind, PairState
from pdserve.transfer.base import LayoutMismatch, TransferError, layout_from_proto, layout_to_proto

if TYPE_CHECKING:
    from pdserve.transfer.nccl import NcclSendHandle, _Outgoing

log = logging.getLogger(__name__)
_CLOSE = None


def _client(address: str, timeout: float) -> dist.TCPStore:
    host, _, port = address.rpartition(":")
    try:
        return dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=timeout))
    except (dist.DistError, ValueError) as err:
        raise TransferError(f"KV store {address} unreachable: {err}", retryable=True,
                            code="UNAVAILABLE") from None


class SenderPair:
    """One decode peer: a two-rank group, a sender thread and an ack thread."""

    def __init__(self, address: str, pair_id: int, peer: KvLayout, stores: tuple[dist.TCPStore, dist.TCPStore],
                 group: dist.Backend, device: torch.device, peer_timeout: float) -> None:
        self.address = address
        self.peer = peer
        self.state = PairState.READY
        self._id = pair_id
        self._store, self._acks = stores
        self._group = group
        self._device = device
        self._peer_timeout = peer_timeout
        self._lock = threading.Lock()
        self._handles: dict[str, NcclSendHandle] = {}
        self._ack_seq = 0
        self._queue: queue.Queue[_Outgoing | None] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._send_loop, name=f"kv-nccl-send-{pair_id}", daemon=True),
            threading.Thread(target=self._ack_loop, name=f"kv-nccl-ack-{pair_id}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @classmethod
    def connect(cls, address: str, layout: KvLayout, device: torch.device, connect_timeout: float,
                peer_timeout: float) -> SenderPair:
        """Claim a pair id at the decode worker's store, compare layouts, build the group.
        Raises LayoutMismatch, or a retryable TransferError when the peer cannot be reached."""
        store = _client(address, connect_timeout)
        try:
            pair_id = store.add(_p2p.counter_key(), 1) - 1
            store.set(_p2p.hello_key(pair_id), layout_to_proto(layout).SerializeToString())
            store.wait([_p2p.reply_key(pair_id)], timedelta(seconds=connect_timeout))
            reply = kv_pb2.HandshakeReply.FromString(store.get(_p2p.reply_key(pair_id)))
        except dist.DistError as err:
            raise TransferError(f"KV handshake with {address} failed: {err}", retryable=True,
                                code="UNAVAILABLE") from None
        peer = layout_from_proto(reply.layout)
        if peer.compat_hash() != layout.compat_hash():
            raise LayoutMismatch.between(layout, peer)
        try:
            prefix = dist.PrefixStore(_p2p.group_prefix(pair_id), store)
            group = _p2p.new_group(prefix, _p2p.PREFILL_RANK, device, peer_timeout)
        except (dist.DistError, RuntimeError) as err:
            raise TransferError(f"KV group with {address} failed: {err}", retryable=True,
                                code="UNAVAILABLE") from None
        acks = _client(address, connect_timeout)
        return cls(address, pair_id, peer, (store, acks), group, device, peer_timeout)

    def register(self, handle: NcclSendHandle) -> None:
        with self._lock:
            if self.state != PairState.READY:
                raise TransferError(f"KV pair with {self.address} is {self.state.value}",
                                    retryable=True, code="UNAVAILABLE")
            if handle.request_id in self._handles:
                raise TransferError(f"request {handle.request_id} is already being sent",
                                    retryable=False, code="ALREADY_EXISTS")
            self._handles[handle.request_id] = handle

    def unregister(self, handle: NcclSendHandle) -> None:
        with self._lock:
            if self._handles.get(handle.request_id) is handle:
                del self._handles[handle.request_id]

    def enqueue(self, item: _Outgoing) -> None:
        """Queue one message; the sender thread sends it after everything queued before."""
        self._queue.put(item)

    def close(self) -> None:
        """Send CLOSE after what is queued, then stop; in-flight transfers fail."""
        self._queue.put(_CLOSE)
        self._threads[0].join(timeout=self._peer_timeout)
        self._break(TransferError("KV sender closed", retryable=True, code="UNAVAILABLE"),
                    PairState.CLOSED)

    def _send_loop(self) -> None:
        try:
            while self.state == PairState.READY:
                try:
                    item = self._queue.get(timeout=self._peer_timeout / 4)
                except queue.Empty:
                    self._send_raw(_p2p.encode_header(Kind.HEARTBEAT))
                    continue
                if item is _CLOSE:
                    self._send_raw(_p2p.encode_header(Kind.CLOSE))
                    return
                self._send_item(item)
        except Exception as err:  # noqa: BLE001 - any send failure ends the pair
            self._break(TransferError(f"KV send to {self.address} failed: {err}",
                                      retryable=True, code="UNAVAILABLE"))

    def _send_item(self, item: _Outgoing) -> None:
        if item.handle.state.final:  # aborted or failed: skip its remaining messages
            return
        item.handle.debug.before_send(item.header)
        size = 0 if item.data is None else item.data.numel()
        self._send_raw(_p2p.encode_header(Kind.CHUNK, item.header, size))
        if item.data is not None:
            if item.ready is not None:
                item.ready.synchronize()
            self._send_raw(item.data)

    def _send_raw(self, tensor: torch.Tensor) -> None:
        tensor = tensor.to(self._device)
        work = self._group.send([tensor], _p2p.DECODE_RANK, 0)
        _p2p.wait_work(work, self._device, self._peer_timeout)

    def _ack_loop(self) -> None:
        while self.state == PairState.READY:
            key = _p2p.ack_key(self._id, self._ack_seq)
            try:
                self._acks.wait([key], timedelta(days=365))
                raw = self._acks.get(key)
                self._acks.delete_key(key)
            except dist.DistError as err:
                self._break(TransferError(f"KV store {self.address} lost: {err}",
                                          retryable=True, code="UNAVAILABLE"))
                return
            self._ack_seq += 1
            if not raw:  # our own wake-up at close
                return
            ack = Ack.decode(raw)
            with self._lock:
                handle = self._handles.get(ack.request_id)
            if handle is not None:  # late or duplicate acks are ignored
                handle.deliver(ack)

    def _break(self, err: TransferError, state: PairState = PairState.BROKEN) -> None:
        """Final: fail every transfer on the pair and release the group."""
        with self._lock:
            if self.state != PairState.READY:
                return
            self.state = state
            handles = list(self._handles.values())
            self._handles.clear()
        if state == PairState.BROKEN:
            log.warning("KV pair %d with %s broken: %s", self._id, self.address, err)
        for handle in handles:
            handle.deliver(None, err)
        try:
            self._store.set(_p2p.ack_key(self._id, self._ack_seq), b"")  # wakes the ack thread
        except dist.DistError:
            pass
        _p2p.abort_group(self._group)
        self._group = None  # destroyed now, not during interpreter teardown (gloo aborts there)
