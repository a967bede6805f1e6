"""The benchmark engine: warm up, send requests at the arrival schedule under a concurrency cap,
collect per-request timings and the metrics of the run."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from pdserve.bench import arrivals, metrics
from pdserve.bench.backends import Backend
from pdserve.bench.datasets import BenchRequest
from pdserve.bench.metrics import RequestOutput


@dataclass(frozen=True)
class RunConfig:
    """Arrival process and limits of one run at one request rate."""

    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    progress: bool = True
    slos_ms: Mapping[str, float] = field(default_factory=dict)


@dataclass
class RunResult:
    """Per-request outputs and aggregate metrics of one run."""

    config: RunConfig
    outputs: list[RequestOutput]
    metrics: dict[str, float]


async def warmup(backend: Backend, requests: Sequence[BenchRequest], max_concurrency: int | None) -> int:
    """Sends requests (not measured) under the concurrency cap; returns how many failed."""
    sem = asyncio.Semaphore(max_concurrency or max(1, len(requests)))

    async def one(req: BenchRequest) -> RequestOutput:
        async with sem:
            return await backend.send(req)

    outs = await asyncio.gather(*(one(r) for r in requests))
    return sum(not o.success for o in outs)


async def run(backend: Backend, requests: Sequence[BenchRequest], cfg: RunConfig) -> RunResult:
    """Sends every request at its arrival time; the duration runs from the first send to the last end."""
    gaps = arrivals.intervals(len(requests), cfg.request_rate, cfg.burstiness, cfg.seed)
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    bar = tqdm(total=len(requests), disable=not cfg.progress, desc=f"rate {cfg.request_rate:g}", unit="req")

    async def one(req: BenchRequest) -> RequestOutput:
        if sem is None:
            out = await backend.send(req)
        else:
            async with sem:
                out = await backend.send(req)
        bar.update(1)
        return out

    start = time.perf_counter()
    tasks = [asyncio.create_task(one(req)) async for req in arrivals.paced(requests, gaps)]
    outputs = list(await asyncio.gather(*tasks))
    duration = time.perf_counter() - start
    bar.close()
    return RunResult(cfg, outputs, metrics.compute(outputs, duration, cfg.slos_ms))
