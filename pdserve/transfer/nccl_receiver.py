"""Decode side of the nccl backend: hosts the TCPStore, accepts pairs, one receiver thread each.

Failure handling: a pair whose peer dies (gloo: the socket closes; NCCL: the operation fails
or the idle watchdog of `peer_timeout` seconds passes without even a heartbeat) goes BROKEN and
its thread exits. Requests it was filling stay reserved, incomplete and unwritten: the decode
engine's lease frees them (forget), exactly as for tcp. Payloads land in a scratch buffer and
reach the pool only through ReceiverCore (validated against the reservation, under its lock).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from datetime import timedelta

import torch
import torch.distributed as dist

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2
from pdserve.transfer import _p2p
from pdserve.transfer._p2p import Ack, Kind, PairState
from pdserve.transfer._receiver import ReceiverCore
from pdserve.transfer._wire import ChunkRejected
from pdserve.transfer.base import CompletionCallback, layout_from_proto, layout_to_proto

log = logging.getLogger(__name__)
_REJECTED_MEMORY = 4096


class NcclKvReceiver(ReceiverCore):
    """KvReceiver for the nccl backend. `kv_address` ("host:port" of its TCPStore) is what
    KvTargets name; prefill workers rendezvous there."""

    def __init__(
        self,
        kv_pool: torch.Tensor,
        layout: KvLayout,
        on_complete: CompletionCallback | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        peer_timeout: float = 10.0,
        max_chunk_bytes: int = 64 << 20,
    ) -> None:
        super().__init__(kv_pool, layout, on_complete)
        self._host = host
        self._peer_timeout = peer_timeout
        self._max_chunk = max_chunk_bytes
        self._store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False)
        self.kv_address = f"{host}:{self._store.port}"
        self._closed = threading.Event()
        self._pairs: list[_ReceiverPair] = []
        self._pairs_lock = threading.Lock()
        self._next = 0
        self._accept = threading.Thread(target=self._accept_loop, name="kv-nccl-accept", daemon=True)
        self._accept.start()

    def pair_states(self) -> list[PairState]:
        """States of the pairs accepted so far (for tests and metrics)."""
        with self._pairs_lock:
            return [pair.state for pair in self._pairs]

    def close(self) -> None:
        """Stop accepting and drop every pair."""
        self._closed.set()
        # The accept thread blocks in a wait on the master's own connection: wake it through
        # another one.
        waker = dist.TCPStore(self._host, self._store.port, is_master=False, wait_for_workers=False)
        waker.set(_p2p.hello_key(self._next), b"")
        self._accept.join(timeout=5)
        with self._pairs_lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.stop()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            key = _p2p.hello_key(self._next)
            try:
                self._store.wait([key], timedelta(days=365))
                raw = self._store.get(key)
            except dist.DistError:
                if self._closed.is_set():
                    return
                continue
            if self._closed.is_set() or not raw:
                return
            pair_id, self._next = self._next, self._next + 1
            self._store.set(_p2p.reply_key(pair_id), _reply(self.layout))
            peer = layout_from_proto(kv_pb2.KvLayout.FromString(raw))
            if peer.compat_hash() != self.layout.compat_hash():
                log.warning("refused KV pair %d: layout %s != mine %s", pair_id,
                            peer.describe(), self.layout.describe())
                continue
            threading.Thread(target=self._open_pair, args=(pair_id,), daemon=True).start()

    def _open_pair(self, pair_id: int) -> None:
        store = dist.TCPStore(self._host, self._store.port, is_master=False, wait_for_workers=False)
        pair = _ReceiverPair(self, pair_id, store)
        with self._pairs_lock:
            self._pairs.append(pair)
        pair.run()


def _reply(layout: KvLayout) -> bytes:
    return kv_pb2.HandshakeReply(layout=layout_to_proto(layout)).SerializeToString()


class _ReceiverPair:
    """One prefill peer: receives header then payload, FIFO, on its own thread."""

    def __init__(self, owner: NcclKvReceiver, pair_id: int, store: dist.TCPStore) -> None:
        self.state = PairState.CONNECTING
        self._owner = owner
        self._id = pair_id
        self._store = store
        self._device = owner._pool.device
        self._group: dist.Backend | None = None
        self._ack_seq = 0
        self._rejected: OrderedDict[str, None] = OrderedDict()

    def run(self) -> None:
        try:
            prefix = dist.PrefixStore(_p2p.group_prefix(self._id), self._store)
            self._group = _p2p.new_group(prefix, _p2p.DECODE_RANK, self._device,
                                         self._owner._peer_timeout)
            self.state = PairState.READY
            while self.state == PairState.READY and self._step():
                pass
            if self.state == PairState.READY:
                self.state = PairState.CLOSED
        except Exception as err:  # noqa: BLE001 - any failure ends this pair only
            if self.state != PairState.CLOSED:
                self.state = PairState.BROKEN
                log.warning("KV pair %d broken: %s", self._id, err)
        finally:
            _p2p.abort_group(self._group)
            self._group = None

    def stop(self) -> None:
        self.state = PairState.CLOSED
        _p2p.abort_group(self._group)

    def _recv(self, nbytes: int) -> torch.Tensor:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        work = self._group.recv([buf], _p2p.PREFILL_RANK, 0)
        _p2p.wait_work(work, self._device, self._owner._peer_timeout)
        return buf

    def _step(self) -> bool:
        """Receive one message; False when the peer closed the pair."""
        kind, header, data_len = _p2p.decode_header(self._recv(_p2p.HEADER_BYTES))
        if kind == Kind.CLOSE:
            return False
        if kind == Kind.HEARTBEAT:
            return True
        if data_len > self._owner._max_chunk:
            raise ValueError(f"payload of {data_len} bytes exceeds {self._owner._max_chunk}")
        data = self._recv(data_len) if data_len else None
        self._apply(header, data)
        return True

    def _apply(self, header: kv_pb2.KvChunk, data: torch.Tensor | None) -> None:
        rid = header.request_id
        if rid in self._rejected:
            return
        try:
            ack = self._owner.apply_tensor(header, data)
        except ChunkRejected as err:
            self._rejected[rid] = None
            while len(self._rejected) > _REJECTED_MEMORY:
                self._rejected.popitem(last=False)
            self._send_ack(Ack(rid, False, code=err.code.name, message=err.message))
            return
        if ack is not None:
            self._send_ack(Ack(rid, True, ack.bytes, ack.chunks))

    def _send_ack(self, ack: Ack) -> None:
        self._store.set(_p2p.ack_key(self._id, self._ack_seq), ack.encode())
        self._ack_seq += 1
