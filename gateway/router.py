"""Chooses the workers of a request (prefill + decode, or one colocated): least loaded, healthy."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import grpc

from pdserve.proto import worker_pb2_grpc
from pdserve.serving import GRPC_OPTIONS
from pdserve.telemetry import client_interceptors


@dataclass
class Worker:
    address: str
    channel: grpc.aio.Channel
    stub: object
    inflight: int = 0
    healthy: bool = True
    order: int = field(default_factory=itertools.count().__next__)


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
        self._turn = itertools.count()

    @staticmethod
    def _connect(address: str, stub_cls: type) -> Worker:
        channel = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS, interceptors=client_interceptors())
        return Worker(address, channel, stub_cls(channel))

    def pick(self, pool: list[Worker], exclude: tuple[Worker, ...] = ()) -> Worker:
        candidates = [w for w in pool if w.healthy and w not in exclude]
        if not candidates:
            raise NoWorker("no healthy worker available")
        turn = next(self._turn)
        return min(candidates, key=lambda w: (w.inflight, (w.order - turn) % len(pool)))

    async def close(self) -> None:
        for w in self.prefill + self.decode + self.colocated:
            await w.channel.close()
