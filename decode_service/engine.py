"""Decode worker engine: KV reservations with leases, and the continuous decode batch."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pdserve.core.request import Sequence, SeqStatus, check_finish
from pdserve.core.sampling import SamplingParams
from pdserve.runtime.loop import EngineLoop, Sink
from pdserve.transfer.base import KvReceiver


class ReservationError(RuntimeError):
    """Decode asked for a reservation that is gone (expired, aborted) or not yet filled."""


@dataclass
class Reservation:
    blocks: list[int]
    num_tokens: int
    deadline: float


class DecodeEngine:
    """Owns a decode worker's reservations; finished transfers join the running batch."""

    def __init__(self, loop: EngineLoop, receiver: KvReceiver, eos_ids: tuple[int, ...], lease_s: float) -> None:
        self.loop = loop
        self.receiver = receiver
        self.eos_ids = eos_ids
        self.lease_s = lease_s
        self._reserved: dict[str, Reservation] = {}
        self.expired_leases = 0

    @property
    def blocks(self):
        return self.loop.scheduler.blocks

    def reserve(self, request_id: str, num_tokens: int) -> list[int]:
        """Blocks for num_tokens prompt tokens; raises NoFreeBlocks when the pool is full."""
        with self.loop.lock:
            if request_id in self._reserved or self.loop.scheduler.get(request_id):
                raise ValueError(f"request {request_id} already exists")
            blocks = self.blocks.allocate(self.blocks.blocks_for(num_tokens))
            self._reserved[request_id] = Reservation(blocks, num_tokens, time.monotonic() + self.lease_s)
        self.receiver.expect(request_id, blocks)
        return blocks

    def start(self, request_id: str, prompt: list[int], first_token: int, params: SamplingParams, sink: Sink) -> None:
        """Turn a filled reservation into a running sequence whose next input is first_token."""
        with self.loop.lock:
            res = self._reserved.get(request_id)
            if res is None:
                raise ReservationError(f"no reservation for request {request_id} (expired or aborted)")
            if res.num_tokens != len(prompt):
                raise ValueError(f"prompt_token_ids: {len(prompt)} tokens, reserved {res.num_tokens}")
            if not self.receiver.is_complete(request_id):
                raise ReservationError(f"KV of request {request_id} has not arrived")
            del self._reserved[request_id]
        self.receiver.forget(request_id)
        seq = Sequence(
            request_id, list(prompt), params, self.eos_ids, output_ids=[first_token],
            block_table=res.blocks, num_computed=len(prompt), status=SeqStatus.RUNNING,
        )
        if check_finish(seq, self.loop.scheduler.cfg.max_model_len) is not None:
            with self.loop.lock:
                self.blocks.free(res.blocks)
            raise ValueError("first_token already ends the request; nothing to decode")
        self.loop.submit(seq, sink)

    def generate(self, request_id: str, prompt: list[int], params: SamplingParams, sink: Sink) -> None:
        """Colocated mode: queue a whole request here; it is prefilled (in chunks mixed into
        the decode steps) and decoded by the same scheduler, with no KV transfer."""
        max_len = self.loop.scheduler.cfg.max_model_len
        if not 0 < len(prompt) < max_len:
            raise ValueError(f"prompt_token_ids: {len(prompt)} tokens, must be in [1, {max_len - 1}]")
        with self.loop.lock:
            if request_id in self._reserved or self.loop.scheduler.get(request_id):
                raise ValueError(f"request {request_id} already exists")
        self.loop.submit(Sequence(request_id, list(prompt), params, self.eos_ids), sink)

    def renew(self, request_id: str) -> bool:
        """Push a reservation's deadline a full lease ahead (its prefill is still on the way)."""
        with self.loop.lock:
            res = self._reserved.get(request_id)
            if res is None:
                return False
            res.deadline = time.monotonic() + self.lease_s
        return True

    def abort(self, request_id: str) -> bool:
        if self._release(request_id):
            return True
        return self.loop.abort(request_id)

    def expire_leases(self) -> int:
        now = time.monotonic()
        late = [rid for rid, r in list(self._reserved.items()) if r.deadline < now]
        for rid in late:
            if self._release(rid):
                self.expired_leases += 1
        return len(late)

    def _release(self, request_id: str) -> bool:
        with self.loop.lock:
            res = self._reserved.pop(request_id, None)
            if res is None:
                return False
            # cuda_ipc: the prefill side may still be writing them; the receiver then calls back.
            if self.receiver.forget(request_id, on_released=lambda: self._free_late(res.blocks)):
                self.blocks.free(res.blocks)
        return True

    def _free_late(self, blocks: list[int]) -> None:
        with self.loop.lock:
            self.blocks.free(blocks)

    @property
    def num_reserved(self) -> int:
        return len(self._reserved)
