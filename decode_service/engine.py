"""Decode worker engine: KV reservations with leases, and the continuous decode batch.

Prefix cache: finished sequences leave their full prompt blocks in the block manager's cache
(the scheduler registers them). A reservation that names its prompt pins the longest cached
prefix and asks the transfer only for the blocks after it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from pdserve.core.request import Sequence, SeqStatus, check_finish
from pdserve.core.sampling import SamplingParams
from pdserve.core.request import TokenGuide
from pdserve.guided import GuideCompiler
from pdserve.runtime.loop import EngineLoop, Sink
from pdserve.transfer.base import KvReceiver


class ReservationError(RuntimeError):
    """Decode asked for a reservation that is gone (expired, aborted) or not yet filled."""


@dataclass
class Reservation:
    blocks: list[int]  # the whole table: `cached_blocks` from the prefix cache, then the transfer's
    num_tokens: int
    deadline: float
    cached_blocks: int = 0
    prompt: tuple[int, ...] = ()  # empty when Reserve did not name the prompt


class DecodeEngine:
    """Owns a decode worker's reservations; finished transfers join the running batch."""

    def __init__(self, loop: EngineLoop, receiver: KvReceiver, eos_ids: tuple[int, ...], lease_s: float,
                 guides: GuideCompiler | None = None) -> None:
        self.loop = loop
        self.receiver = receiver
        self.eos_ids = eos_ids
        self.guides = guides  # structured output's grammars (None: the model has no tokenizer.json)
        self.lease_s = lease_s
        self._reserved: dict[str, Reservation] = {}
        self.expired_leases = 0
        self.kv_received_blocks = 0  # blocks filled by completed transfers
        self.kv_received_bytes = 0  # payload bytes written by transfers, complete or not

    @property
    def blocks(self):
        return self.loop.scheduler.blocks

    def reserve(self, request_id: str, num_tokens: int, prompt: Seq[int] = ()) -> tuple[list[int], int]:
        """Blocks for num_tokens prompt tokens: (the blocks the transfer must fill, prompt tokens
        already cached here). With the prompt, its cached prefix is pinned and not transferred.
        Raises NoFreeBlocks when the pool is full."""
        if prompt and len(prompt) != num_tokens:
            raise ValueError(f"prompt_token_ids: {len(prompt)} tokens, num_tokens is {num_tokens}")
        sched = self.loop.scheduler
        hashes = self.blocks.hashes(prompt) if sched.cfg.enable_prefix_caching else []
        with self.loop.lock:
            if request_id in self._reserved or sched.get(request_id) or sched.in_step(request_id):
                raise ValueError(f"request {request_id} already exists")
            table, hit = self.blocks.allocate_prompt(num_tokens, hashes)
            self._reserved[request_id] = Reservation(
                table, num_tokens, time.monotonic() + self.lease_s, hit, tuple(prompt))
        self.receiver.expect(request_id, table[hit:])
        return table[hit:], hit * self.blocks.block_size

    def start(self, request_id: str, prompt: list[int], first_token: int, params: SamplingParams, sink: Sink,
              guide: TokenGuide | None = None) -> None:
        """Turn a filled reservation into a running sequence whose next input is first_token;
        `guide`: params.guide's state past first_token (make_guide(self.guides, params, (first_token,))),
        built by the caller off its event loop."""
        with self.loop.lock:
            res = self._reserved.get(request_id)
            if res is None:
                raise ReservationError(f"no reservation for request {request_id} (expired or aborted)")
            if res.num_tokens != len(prompt):
                raise ValueError(f"prompt_token_ids: {len(prompt)} tokens, reserved {res.num_tokens}")
            if res.prompt and res.prompt != tuple(prompt):  # the pinned prefix is this prompt's
                raise ValueError("prompt_token_ids: differ from the prompt named at Reserve")
            if not self.receiver.is_complete(request_id):
                raise ReservationError(f"KV of request {request_id} has not arrived")
            del self._reserved[request_id]
            cached = res.cached_blocks * self.blocks.block_size
            self.loop.scheduler.prefix_hit_tokens += cached
            self._count_received(request_id, res)
        self.receiver.forget(request_id)
        seq = Sequence(
            request_id, list(prompt), params, self.eos_ids, output_ids=[first_token],
            block_table=res.blocks, num_computed=len(prompt), num_cached=cached, status=SeqStatus.RUNNING,
            guide=guide,
        )
        if check_finish(seq, self.loop.scheduler.cfg.max_model_len) is not None:
            with self.loop.lock:
                self.blocks.free(res.blocks)
            raise ValueError("first_token already ends the request; nothing to decode")
        self.loop.submit(seq, sink)

    def kv_on_the_way(self, request_id: str) -> bool:
        """True while the request is reserved and its transfer has not completed: a direct
        writer (cuda_ipc) answers the prefill once its copies landed, and its last chunk may
        reach this worker after the gateway's Decode."""
        with self.loop.lock:
            if request_id not in self._reserved:
                return False
            try:
                return not self.receiver.is_complete(request_id)
            except KeyError:
                return False

    def generate(self, request_id: str, prompt: list[int], params: SamplingParams, sink: Sink,
                 guide: TokenGuide | None = None) -> None:
        """Colocated mode: queue a whole request here; it is prefilled (in chunks mixed into
        the decode steps) and decoded by the same scheduler, with no KV transfer."""
        max_len = self.loop.scheduler.cfg.max_model_len
        if not 0 < len(prompt) < max_len:
            raise ValueError(f"prompt_token_ids: {len(prompt)} tokens, must be in [1, {max_len - 1}]")
        sched = self.loop.scheduler
        with self.loop.lock:
            if request_id in self._reserved or sched.get(request_id) or sched.in_step(request_id):
                raise ValueError(f"request {request_id} already exists")
        self.loop.submit(Sequence(request_id, list(prompt), params, self.eos_ids, guide=guide), sink)

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
            self._count_received(request_id, res)
            # cuda_ipc: the prefill side may still be writing them; the receiver then calls back.
            if self.receiver.forget(request_id, on_released=lambda: self._free_late(res.blocks)):
                self.blocks.free(res.blocks)
        return True

    def _free_late(self, blocks: list[int]) -> None:
        with self.loop.lock:
            self.blocks.free(blocks)

    def _count_received(self, request_id: str, res: Reservation) -> None:
        """Add what the transfer of a reservation being dropped wrote (under the loop lock)."""
        try:
            nbytes, complete = self.receiver.received_bytes(request_id), self.receiver.is_complete(request_id)
        except KeyError:  # released between the reservation and receiver.expect()
            return
        self.kv_received_bytes += nbytes
        if complete:
            self.kv_received_blocks += len(res.blocks) - res.cached_blocks

    @property
    def num_reserved(self) -> int:
        return len(self._reserved)
