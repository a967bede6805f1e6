"""The whole path of one request across the workers: reserve, prefill, decode, abort.

Yields lists of new token ids, the last one with the worker's finish reason. Whatever ends
the generator early (client cancel, deadline, stop string, error) aborts the request on every
worker it touched, so no block outlives it. In colocated mode one worker does all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from gateway.router import Router, Worker
from pdserve.proto import worker_pb2
from pdserve.telemetry import tracer

WIRE_FINISH = {worker_pb2.WORKER_FINISH_STOP: "stop", worker_pb2.WORKER_FINISH_LENGTH: "length",
               worker_pb2.WORKER_FINISH_ABORT: "abort"}


@dataclass(frozen=True)
class Job:
    request_id: str
    prompt: list[int]
    sampling: worker_pb2.WorkerSampling
    first_token_finishes: object  # callable(token) -> finish reason or None


Tokens = AsyncIterator[tuple[list[int], str | None]]


def run(job: Job, router: Router, timeout: float | None) -> Tokens:
    """The token stream of job: colocated when the router has colocated workers."""
    return (_colocated if router.colocated else _disaggregated)(job, router, timeout)


async def _colocated(job: Job, router: Router, timeout: float | None) -> Tokens:
    worker, done = router.pick(router.colocated), False
    worker.inflight += 1
    try:
        call = worker.stub.Generate(worker_pb2.GenerateWork(
            request_id=job.request_id, prompt_token_ids=job.prompt, sampling=job.sampling), timeout=timeout)
        async for batch in call:
            finish = WIRE_FINISH.get(batch.finish)
            done = finish is not None
            yield list(batch.token_ids), finish
            if done:
                return
    finally:
        worker.inflight -= 1
        if not done:
            await _abort(worker, job.request_id)


async def _disaggregated(job: Job, router: Router, timeout: float | None) -> Tokens:
    with tracer().start_as_current_span("router.select") as span:
        decode, prefill = router.pick(router.decode), router.pick(router.prefill)
        span.set_attributes({"pdserve.decode.address": decode.address, "pdserve.prefill.address": prefill.address})
    rid, done, prefilled = job.request_id, False, False
    decode.inflight += 1
    prefill.inflight += 1
    try:
        with tracer().start_as_current_span("decode.reserve", attributes={"pdserve.num_tokens": len(job.prompt)}):
            target = await decode.stub.Reserve(
                worker_pb2.ReserveRequest(request_id=rid, num_tokens=len(job.prompt)), timeout=timeout)
        first = await _prefill(prefill, decode, worker_pb2.PrefillRequest(
            request_id=rid, prompt_token_ids=job.prompt, sampling=job.sampling, target=target),
            target.lease_ms / 1000, timeout)
        prefill.inflight -= 1
        prefilled = True
        finish = job.first_token_finishes(first.first_token)
        if finish is not None:
            await _abort(decode, rid)  # release the reservation: nothing to decode
            done = True
            yield [first.first_token], finish
            return
        yield [first.first_token], None
        call = decode.stub.Decode(worker_pb2.DecodeRequest(
            request_id=rid, prompt_token_ids=job.prompt, first_token=first.first_token,
            sampling=job.sampling), timeout=timeout)
        async for batch in call:
            finish = WIRE_FINISH.get(batch.finish)
            done = finish is not None
            yield list(batch.token_ids), finish
            if done:
                return
    finally:
        decode.inflight -= 1
        if not prefilled:
            prefill.inflight -= 1
        if not done:
            await _abort(prefill, rid)
            await _abort(decode, rid)


async def _prefill(prefill: Worker, decode: Worker, req: worker_pb2.PrefillRequest, lease_s: float,
                   timeout: float | None) -> worker_pb2.PrefillResponse:
    """Prefill, renewing the decode reservation while the prompt waits in the prefill queue."""
    call = prefill.stub.Prefill(req, timeout=timeout)
    task = asyncio.ensure_future(call)
    try:
        while True:
            finished, _ = await asyncio.wait({task}, timeout=max(lease_s / 3, 0.05))
            if finished:
                return task.result()
            with contextlib.suppress(grpc.RpcError):
                await decode.stub.Renew(worker_pb2.RenewRequest(request_id=req.request_id), timeout=2.0)
    finally:
        call.cancel()


async def _abort(worker: Worker, rid: str) -> None:
    with contextlib.suppress(grpc.RpcError):
        await worker.stub.Abort(worker_pb2.AbortRequest(request_id=rid), timeout=2.0)
