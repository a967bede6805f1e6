"""gRPC face of the decode worker: Reserve, Decode (token stream), Generate (colocated), Abort, GetStats."""

from __future__ import annotations

import asyncio
import logging

import grpc

from decode_service.engine import DecodeEngine, ReservationError
from decode_service.spans import DecodeSpans
from pdserve.core.block_manager import NoFreeBlocks
from pdserve.core.kv_layout import KvLayout
from pdserve.core.request import Finish
from pdserve.proto import worker_pb2, worker_pb2_grpc
from pdserve.serving import sampling_from_wire
from pdserve.streams import EventStream
from pdserve.transfer.base import layout_to_proto

log = logging.getLogger(__name__)

FINISH_TO_WIRE = {
    Finish.STOP: worker_pb2.WORKER_FINISH_STOP,
    Finish.LENGTH: worker_pb2.WORKER_FINISH_LENGTH,
    Finish.ABORT: worker_pb2.WORKER_FINISH_ABORT,
}


class DecodeServicer(worker_pb2_grpc.DecodeWorkerServicer):
    def __init__(self, engine: DecodeEngine, layout: KvLayout, kv_address: str, backend: str, model: str,
                 role: str = "decode") -> None:
        self.engine = engine
        self.role = role
        self.layout = layout
        self.kv_address = kv_address
        self.backend = backend
        self.model = model
        self.spans = DecodeSpans()

    async def Reserve(self, request: worker_pb2.ReserveRequest, context: grpc.aio.ServicerContext) -> worker_pb2.KvTarget:
        max_len = self.engine.loop.scheduler.cfg.max_model_len
        if not request.request_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id: empty")
        if not 0 < request.num_tokens <= max_len:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"num_tokens: must be in [1, {max_len}]")
        prompt = request.prompt_token_ids
        if prompt and len(prompt) != request.num_tokens:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"prompt_token_ids: {len(prompt)} tokens, num_tokens is {request.num_tokens}")
        try:
            blocks, cached = self.engine.reserve(request.request_id, request.num_tokens, prompt)
            self.spans.reserved(request.request_id)
        except NoFreeBlocks as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"decode KV pool full: {e}")
        except ValueError as e:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(e))
        return worker_pb2.KvTarget(
            request_id=request.request_id, block_ids=blocks, layout=layout_to_proto(self.layout),
            backend=self.backend, address=self.kv_address, lease_ms=int(self.engine.lease_s * 1000),
            num_tokens=request.num_tokens, cached_tokens=cached,
        )

    async def Renew(self, request: worker_pb2.RenewRequest, context: grpc.aio.ServicerContext) -> worker_pb2.RenewResponse:
        return worker_pb2.RenewResponse(found=self.engine.renew(request.request_id))

    async def Decode(self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext):
        rid = request.request_id
        try:
            params = sampling_from_wire(request.sampling)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{e}")
        stream = EventStream()
        try:
            self.engine.start(rid, list(request.prompt_token_ids), request.first_token, params, stream.sink)
        except ReservationError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        span, n = self.spans.started(rid, context), 0
        try:
            async for batch in self._relay(rid, stream):
                n += len(batch.token_ids)
                yield batch
        finally:
            span.set_attribute("gen_ai.usage.output_tokens", n)
            span.end()

    async def Generate(self, request: worker_pb2.GenerateWork, context: grpc.aio.ServicerContext):
        """Colocated mode: prefill and decode the request on this worker, streaming tokens."""
        rid = request.request_id
        if not rid:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id: empty")
        try:
            params = sampling_from_wire(request.sampling)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{e}")
        stream = EventStream()
        try:
            self.engine.generate(rid, list(request.prompt_token_ids), params, stream.sink)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        async for batch in self._relay(rid, stream):
            yield batch

    async def _relay(self, rid: str, stream: EventStream):
        """Token events of rid as TokenBatches until it finishes; aborts it if the caller leaves."""
        finished = False
        try:
            while not finished:
                batch = worker_pb2.TokenBatch()
                for ev in await stream.next_batch():
                    if ev.token >= 0:
                        batch.token_ids.append(ev.token)
                    if ev.finish is not None:
                        batch.finish = FINISH_TO_WIRE[ev.finish]
                        finished = True
                yield batch
        finally:
            if not finished:  # the caller went away (cancel, deadline): free the blocks now
                self.engine.abort(rid)

    async def Abort(self, request: worker_pb2.AbortRequest, context: grpc.aio.ServicerContext) -> worker_pb2.AbortResponse:
        self.spans.forget(request.request_id)
        return worker_pb2.AbortResponse(found=self.engine.abort(request.request_id))

    async def GetStats(self, request: worker_pb2.StatsRequest, context: grpc.aio.ServicerContext) -> worker_pb2.WorkerStats:
        sched = self.engine.loop.scheduler
        with self.engine.loop.lock:
            return worker_pb2.WorkerStats(
                role=self.role, free_blocks=sched.blocks.num_free, total_blocks=sched.blocks.num_total,
                running=len(sched.running), waiting=len(sched.waiting) + self.engine.num_reserved,
                queued_tokens=sched.queued_tokens, layout=layout_to_proto(self.layout), model=self.model,
                max_model_len=sched.cfg.max_model_len, prefix_cache_hits=sched.prefix_hit_tokens,
                preemptions=sched.preemptions, kv_received_blocks=self.engine.kv_received_blocks,
                kv_received_bytes=self.engine.kv_received_bytes, engine_steps=self.engine.loop.steps,
                **spec_stats(sched),
            )


def spec_stats(sched) -> dict:
    """WorkerStats' speculative-decoding fields (empty when speculation is off)."""
    if sched.spec is None:
        return {}
    st = sched.spec.stats
    return dict(spec_num_drafts=st.steps, spec_draft_tokens=st.proposed, spec_accepted_tokens=st.accepted,
                spec_accepted_per_pos=list(st.accepted_per_pos))


async def lease_reaper(engine: DecodeEngine, period_s: float = 0.25) -> None:
    """Frees reservations whose Decode never came (the prefill side died or gave up)."""
    while True:
        await asyncio.sleep(period_s)
        n = engine.expire_leases()
        if n:
            log.warning("freed %d expired KV reservations", n)
