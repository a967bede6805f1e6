"""Chooses the workers of a request: healthy, least loaded, prefix affinity for prefill.

Load comes from two places: what this gateway has in flight on a worker (exact, immediate) and
the worker's own GetStats (every gateway's load), polled by `gateway.health.Monitor`.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2_grpc

from gateway.mux import TokenMux
from pdserve.proto import worker_pb2, worker_pb2_grpc
from pdserve.serving import GRPC_OPTIONS
from pdserve.telemetry import client_interceptors

KEEPALIVE = [
    ("grpc.keepalive_time_ms", 2000),  # a silent peer is found within ~4 s
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 500),  # +-20 % jitter: inside health.Monitor's 1 s check
]
AFFINITY_SLACK_TOKENS = 2048  # the affine prefill worker may be this much busier than the least loaded
AFFINITY_BLOCK = 16  # prompt tokens hashed for affinity when the worker has not said its block size


@dataclass(eq=False)
class Worker:
    address: str
    channel: grpc.aio.Channel
    stub: object
    health: object
    inflight: int = 0
    pending_tokens: int = 0  # prompt tokens this gateway sent for prefill, not yet answered
    healthy: bool = True
    stats: worker_pb2.WorkerStats | None = None
    last_error: str = "no health check yet"  # why the latest failed check failed (for logs and errors)
    order: int = field(default_factory=itertools.count().__next__)
    mux: TokenMux | None = None  # decode and colocated workers: their token stream

    def prefill_load(self) -> int:
        queued = self.stats.queued_tokens if self.stats else 0
        return max(queued, self.pending_tokens)

    def decode_load(self) -> tuple[int, int]:
        s = self.stats
        running = (s.running + s.waiting) if s else 0
        return max(running, self.inflight), -(s.free_blocks if s else 0)


T = TypeVar("T")


class NoWorker(RuntimeError):
    """No healthy worker of the asked role."""


class Router:
    """Worker pools: prefill + decode (disaggregated), or colocated workers that do both."""

    def __init__(self, prefill: list[str], decode: list[str], colocated: list[str] | None = None) -> None:
        colocated = colocated or []
        if bool(colocated) == bool(prefill or decode):
            raise ValueError("give colocated workers, or prefill and decode workers, not both")
        if not colocated and not (prefill and decode):
            raise ValueError("need at least one prefill and one decode worker")
        self.prefill = [self._connect(a, worker_pb2_grpc.PrefillWorkerStub) for a in prefill]
        self.decode = [self._connect(a, worker_pb2_grpc.DecodeWorkerStub) for a in decode]
        self.colocated = [self._connect(a, worker_pb2_grpc.DecodeWorkerStub) for a in colocated]
        # one turn counter per pool: a shared one advanced by both picks of each request (prefill,
        # then decode) handed every decode ranking the same parity, so with two decode workers
        # and equal loads all requests went to one of them
        self._turns = {id(pool): itertools.count() for pool in (self.prefill, self.decode, self.colocated)}
        self.queue_wait_s = 30.0  # how long a request waits for room in a decode pool
        # the priorities of the requests waiting for room in a decode pool (flow._reserve): one
        # with a higher value tries only while none of a lower value waits
        self.waiting: collections.Counter[int] = collections.Counter()
        self.recheck: Callable[[], Awaitable[None]] | None = None  # set by the health monitor

    @property
    def workers(self) -> list[Worker]:
        return self.prefill + self.decode + self.colocated

    @staticmethod
    def _connect(address: str, stub_cls: type) -> Worker:
        channel = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS + KEEPALIVE,
                                            interceptors=client_interceptors())
        stub = stub_cls(channel)
        mux = TokenMux(stub) if stub_cls is worker_pb2_grpc.DecodeWorkerStub else None
        return Worker(address, channel, stub, health_pb2_grpc.HealthStub(channel), mux=mux)

    def ranked(self, pool: list[Worker], exclude: tuple[Worker, ...] = ()) -> list[Worker]:
        """Healthy workers of pool, least loaded first (excluded ones only when nothing else is left)."""
        healthy = [w for w in pool if w.healthy]
        candidates = [w for w in healthy if w not in exclude] or healthy
        if not candidates:
            why = "; ".join(f"{w.address}: {w.last_error}" for w in pool)
            raise NoWorker(f"no healthy {self._role(pool)} worker available ({why})")
        turn = next(self._turns[id(pool)])
        load = (lambda w: (w.prefill_load(),)) if pool is self.prefill else (lambda w: w.decode_load())
        return sorted(candidates, key=lambda w: (*load(w), (w.order - turn) % len(pool)))

    def _role(self, pool: list[Worker]) -> str:
        return "prefill" if pool is self.prefill else "decode" if pool is self.decode else "colocated"

    def pick(self, pool: list[Worker], exclude: tuple[Worker, ...] = ()) -> Worker:
        return self.ranked(pool, exclude)[0]

    def pick_prefill(self, prompt: list[int], exclude: tuple[Worker, ...] = ()) -> Worker:
        """The prompt's affine prefill worker (its cached prefix) unless it is much busier than the least loaded."""
        ranked = self.ranked(self.prefill, exclude)
        block = ranked[0].stats.layout.block_size if ranked[0].stats and ranked[0].stats.layout.block_size \
            else AFFINITY_BLOCK
        if len(ranked) == 1 or len(prompt) < block:
            return ranked[0]
        key = hashlib.blake2b(repr(prompt[:block]).encode(), digest_size=8).digest()
        affine = max(ranked, key=lambda w: hashlib.blake2b(key + w.address.encode(), digest_size=8).digest())
        if affine.prefill_load() <= ranked[0].prefill_load() + AFFINITY_SLACK_TOKENS:
            return affine
        return ranked[0]

    async def choose(self, pick: Callable[[], T]) -> T:
        """pick(), checking every worker's health once more first if it finds none healthy."""
        try:
            return pick()
        except NoWorker:
            if self.recheck is None:
                raise
            await self.recheck()
            return pick()

    def suspect(self, worker: Worker, error: grpc.aio.AioRpcError) -> None:
        """A call to worker failed as if it were gone: out until its health check passes again."""
        worker.healthy = False
        worker.last_error = f"a call failed: {error.code().name} {error.details()}"

    async def close(self) -> None:
        for w in self.workers:
            if w.mux is not None:
                await w.mux.close()
            await w.channel.close()
