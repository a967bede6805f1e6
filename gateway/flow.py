"""The whole path of one request across the workers: reserve, prefill, decode, abort, retry.

Yields lists of new token ids, the last one with the worker's finish reason, each with the
tokens' logprobs when the request asked for them (and the first with the prompt's, when asked
for). Whatever ends
the generator early (client cancel, deadline, stop string, error) aborts the request on every
worker it touched, so no block outlives it. UNAVAILABLE from a worker before any token was
yielded is retried once on other workers; after a token, it reaches the caller. A full decode
pool (Reserve: RESOURCE_EXHAUSTED) sends the request to the next decode worker, then makes it
wait (bounded by `Router.queue_wait_s` and its deadline). In colocated mode one worker does all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from gateway.deadline import Deadline
from gateway.errors import GatewayError
from gateway.router import Router, Worker
from pdserve.proto import worker_pb2
from pdserve.telemetry import tracer

log = logging.getLogger(__name__)

WIRE_FINISH = {worker_pb2.WORKER_FINISH_STOP: "stop", worker_pb2.WORKER_FINISH_LENGTH: "length",
               worker_pb2.WORKER_FINISH_ABORT: "abort"}
RESERVE_TIMEOUT_S = 10.0
PREFILL_TIMEOUT_S = 300.0
CONTROL_TIMEOUT_S = 2.0  # Abort, Renew
FULL_RETRY_AFTER_MS = 1000


@dataclass(frozen=True)
class Job:
    request_id: str
    prompt: list[int]
    sampling: worker_pb2.WorkerSampling
    first_token_finishes: Callable[[int], str | None]


Logprobs = list[worker_pb2.WorkerLogprobs]  # one per token id, or empty: not asked for


@dataclass(frozen=True)
class Batch:
    """New token ids of a request; `finish` (the worker's reason) on the last batch.
    `prompt_logprobs`: the first batch's, when the request asked for them."""

    ids: list[int]
    finish: str | None = None
    logprobs: Logprobs = field(default_factory=list)
    prompt_logprobs: Logprobs = field(default_factory=list)


Tokens = AsyncIterator[Batch]
Attempt = Callable[[Job, Router, Deadline, list[Worker]], Tokens]


def run(job: Job, router: Router, deadline: Deadline) -> Tokens:
    """The token stream of job: colocated when the router has colocated workers."""
    return _with_retry(_colocated if router.colocated else _disaggregated, job, router, deadline)


async def _with_retry(attempt: Attempt, job: Job, router: Router, deadline: Deadline) -> Tokens:
    """attempt, and once more on other workers if it failed UNAVAILABLE before its first token."""
    tried: list[Worker] = []
    for n in range(2):
        streamed = False
        try:
            async with contextlib.aclosing(attempt(job, router, deadline, tried)) as tokens:
                async for item in tokens:
                    streamed = True
                    yield item
            return
        except grpc.aio.AioRpcError as e:
            if streamed or n == 1 or e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            log.warning("request %s: %s; retrying on another worker", job.request_id, e.details())


async def _colocated(job: Job, router: Router, deadline: Deadline, tried: list[Worker]) -> Tokens:
    worker = await router.choose(lambda: router.pick(router.colocated, tuple(tried)))
    tried.append(worker)
    worker.inflight += 1
    done = False
    try:
        def start(subscriber: str):
            return worker.stub.StartGenerate(worker_pb2.GenerateWork(
                request_id=job.request_id, prompt_token_ids=job.prompt, sampling=job.sampling,
                subscriber_id=subscriber), timeout=deadline.remaining(CONTROL_TIMEOUT_S))
        async for item in _tokens(worker, job.request_id, start, router, deadline):
            done = item.finish is not None
            yield item
    finally:
        worker.inflight -= 1
        if not done:
            await _abort(worker, job.request_id)


async def _disaggregated(job: Job, router: Router, deadline: Deadline, tried: list[Worker]) -> Tokens:
    rid = job.request_id
    with tracer().start_as_current_span("router.select") as span:
        prefill = await router.choose(lambda: router.pick_prefill(job.prompt, tuple(tried)))
        span.set_attribute("pdserve.prefill.address", prefill.address)
    decode, target = await _reserve(job, router, deadline, tried)  # counts itself in decode.inflight
    tried.extend((prefill, decode))  # a retry after a failed prefill or transfer avoids both
    done = False
    try:
        first = await _prefill(prefill, decode, worker_pb2.PrefillRequest(
            request_id=rid, prompt_token_ids=job.prompt, sampling=job.sampling, target=target),
            target.lease_ms / 1000, deadline)
        finish = job.first_token_finishes(first.first_token)
        logprobs = [first.first_logprobs] if first.HasField("first_logprobs") else []
        batch = Batch([first.first_token], finish, logprobs, list(first.prompt_logprobs))
        if finish is not None:
            await _abort(decode, rid)  # release the reservation: nothing to decode
            done = True
            yield batch
            return
        yield batch

        def start(subscriber: str):
            return decode.stub.StartDecode(worker_pb2.DecodeRequest(
                request_id=rid, prompt_token_ids=job.prompt, first_token=first.first_token,
                sampling=job.sampling, subscriber_id=subscriber), timeout=deadline.remaining(CONTROL_TIMEOUT_S))
        async for item in _tokens(decode, rid, start, router, deadline):
            done = item.finish is not None
            yield item
    finally:
        decode.inflight -= 1
        if not done:
            await asyncio.gather(_abort(prefill, rid), _abort(decode, rid))


async def _tokens(worker: Worker, rid: str, start, router: Router, deadline: Deadline) -> Tokens:
    """Token batches of rid from the worker's token stream until a finish; a lost worker is
    taken out of the router."""
    try:
        async for batch in worker.mux.stream(rid, start, deadline.remaining()):
            finish = WIRE_FINISH.get(batch.finish)
            yield Batch(list(batch.token_ids), finish, list(batch.logprobs), list(batch.prompt_logprobs))
            if finish is not None:
                return
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            router.suspect(worker, e)
        raise


async def _reserve(job: Job, router: Router, deadline: Deadline,
                   tried: list[Worker]) -> tuple[Worker, worker_pb2.KvTarget]:
    """A decode worker with room for the prompt: least loaded first, then the others, then wait.
    The request counts in the worker's `inflight` from before its Reserve call (the caller takes
    it off when the request ends), so a burst of arrivals ranks on the reservations in flight
    and spreads over the workers instead of all ranking the same idle one first. While requests
    of a lower priority value wait for room, this one does not try (the room is theirs first)."""
    priority = job.sampling.priority
    router.waiting[priority] += 1
    try:
        return await _reserve_in_turn(job, router, deadline, tried, priority)
    finally:
        router.waiting[priority] -= 1
        if not router.waiting[priority]:
            del router.waiting[priority]


async def _reserve_in_turn(job: Job, router: Router, deadline: Deadline, tried: list[Worker],
                           priority: int) -> tuple[Worker, worker_pb2.KvTarget]:
    """_reserve's tries: each round every decode worker in rank order, unless a more urgent request waits."""
    req = worker_pb2.ReserveRequest(request_id=job.request_id, num_tokens=len(job.prompt),
                                   prompt_token_ids=job.prompt)  # for the decode prefix cache
    give_up, pause = time.monotonic() + router.queue_wait_s, 0.02
    while True:
        ours = min(router.waiting) >= priority
        decodes = await router.choose(lambda: router.ranked(router.decode, tuple(tried))) if ours else []
        for decode in decodes:
            decode.inflight += 1
            try:
                with tracer().start_as_current_span("decode.reserve", attributes={
                        "pdserve.num_tokens": len(job.prompt), "pdserve.decode.address": decode.address}):
                    return decode, await decode.stub.Reserve(req, timeout=deadline.remaining(RESERVE_TIMEOUT_S))
            except grpc.aio.AioRpcError as e:
                decode.inflight -= 1
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    router.suspect(decode, e)
                    tried.append(decode)
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
            except BaseException:  # the deadline, a cancelled request: not reserved after all
                decode.inflight -= 1
                raise
        if time.monotonic() >= give_up:
            raise GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED, "every decode KV pool is full; retry later",
                               retry_after_ms=FULL_RETRY_AFTER_MS)
        await asyncio.sleep(deadline.remaining(pause))
        pause = min(pause * 2, 0.2)


async def _prefill(prefill: Worker, decode: Worker, req: worker_pb2.PrefillRequest, lease_s: float,
                   deadline: Deadline) -> worker_pb2.PrefillResponse:
    """Prefill, renewing the decode reservation while the prompt waits in the prefill queue."""
    n = len(req.prompt_token_ids)
    prefill.inflight += 1
    prefill.pending_tokens += n
    call = prefill.stub.Prefill(req, timeout=deadline.remaining(PREFILL_TIMEOUT_S))
    task = asyncio.ensure_future(call)
    try:
        while True:
            finished, _ = await asyncio.wait({task}, timeout=max(lease_s / 3, 0.05))
            if finished:
                return task.result()
            with contextlib.suppress(grpc.RpcError):
                await decode.stub.Renew(worker_pb2.RenewRequest(request_id=req.request_id),
                                        timeout=CONTROL_TIMEOUT_S)
    finally:
        call.cancel()
        prefill.inflight -= 1
        prefill.pending_tokens -= n


async def _abort(worker: Worker, rid: str) -> None:
    with contextlib.suppress(grpc.RpcError):
        await worker.stub.Abort(worker_pb2.AbortRequest(request_id=rid), timeout=CONTROL_TIMEOUT_S)
