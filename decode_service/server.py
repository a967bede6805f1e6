"""gRPC face of the decode worker: Reserve, Decode (token stream), Generate (colocated), their
multiplexed forms (Subscribe + StartDecode / StartGenerate), Abort, GetStats."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc
from opentelemetry import trace

from decode_service.engine import DecodeEngine, ReservationError
from decode_service.spans import DecodeSpans
from decode_service.subscriptions import Subscription, add_event
from pdserve.core.block_manager import NoFreeBlocks
from pdserve.core.kv_layout import KvLayout
from pdserve.core.sampling import ValidationError
from pdserve.guided import follow
from pdserve.proto import worker_pb2, worker_pb2_grpc
from pdserve.runtime.loop import Sink
from pdserve.serving import sampling_from_wire
from pdserve.streams import EventStream
from pdserve.transfer.base import layout_to_proto

log = logging.getLogger(__name__)



class DecodeServicer(worker_pb2_grpc.DecodeWorkerServicer):
    def __init__(self, engine: DecodeEngine, layout: KvLayout, kv_address: str, backend: str, model: str,
                 role: str = "decode", vocab_size: int | None = None) -> None:
        self.engine = engine
        self.vocab_size = vocab_size  # for the sampling's token ids (logit_bias); None: unchecked
        self.role = role
        self.layout = layout
        self.kv_address = kv_address
        self.backend = backend
        self.model = model
        self.spans = DecodeSpans()
        self.subscriptions: dict[str, Subscription] = {}

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
        stream = EventStream()
        await self._start_decode(request, context, stream.sink)
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
        stream = EventStream()
        await self._start_generate(request, context, stream.sink)
        async for batch in self._relay(request.request_id, stream):
            yield batch

    async def Subscribe(self, request: worker_pb2.SubscribeRequest, context: grpc.aio.ServicerContext):
        """A gateway's token stream: an empty first message, then one per engine step with the
        tokens of every request started on it; requests still running when it ends are aborted."""
        sid = request.subscriber_id
        if not sid:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "subscriber_id: empty")
        if sid in self.subscriptions:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"subscriber_id: {sid!r} is already subscribed")
        sub = self.subscriptions[sid] = Subscription()
        try:
            yield worker_pb2.StepTokens()
            while True:
                yield sub.message(await sub.stream.next_batch())
        finally:
            del self.subscriptions[sid]
            for rid in sub.close():  # the gateway went away: free the blocks now
                self.engine.abort(rid)

    async def StartDecode(self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext
                          ) -> worker_pb2.Started:
        """Decode with the tokens on the Subscribe stream `subscriber_id`."""
        await self._start_on(request.subscriber_id, request.request_id, context,
                             lambda sink: self._start_decode(request, context, sink),
                             lambda: self.spans.started(request.request_id, context))
        return worker_pb2.Started()

    async def StartGenerate(self, request: worker_pb2.GenerateWork, context: grpc.aio.ServicerContext
                            ) -> worker_pb2.Started:
        """Generate (colocated) with the tokens on the Subscribe stream `subscriber_id`."""
        await self._start_on(request.subscriber_id, request.request_id, context,
                             lambda sink: self._start_generate(request, context, sink), lambda: trace.INVALID_SPAN)
        return worker_pb2.Started()

    async def _start_on(self, sid: str, rid: str, context: grpc.aio.ServicerContext,
                        start: Callable[[Sink], Awaitable[None]], span: Callable[[], trace.Span]) -> None:
        """start(sink) the request with its events going to subscription sid; the request is on
        the subscription before it starts (a stream that closes meanwhile aborts it)."""
        sub = self.subscriptions.get(sid)
        if sub is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"subscriber_id: {sid!r} has no open Subscribe stream here")
        sub.add(rid)
        try:
            await start(sub.stream.sink)
        except BaseException:
            sub.discard(rid)
            raise
        sub.add(rid, span())

    async def _start_decode(self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext,
                            sink) -> None:
        try:
            params = sampling_from_wire(request.sampling, self.vocab_size)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{e}")
        guide = await self._guide(params, (request.first_token,), context)
        await self._kv_arrived(request.request_id)
        try:
            self.engine.start(request.request_id, list(request.prompt_token_ids), request.first_token, params, sink,
                              guide)
        except ReservationError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def _guide(self, params, generated: tuple[int, ...], context: grpc.aio.ServicerContext):
        """params.guide's state past `generated` (None: free text; guided.follow); INVALID_ARGUMENT
        naming it otherwise."""
        try:
            return await follow(self.engine.guides, params, generated)
        except ValidationError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{e}")

    async def _kv_arrived(self, rid: str) -> None:
        """Wait while the transfer's last chunk is on the way (bounded by the reservation's
        lease: an expired reservation ends the wait and start() reports it)."""
        delay = 0.0002
        while self.engine.kv_on_the_way(rid):
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.01)

    async def _start_generate(self, request: worker_pb2.GenerateWork, context: grpc.aio.ServicerContext,
                              sink) -> None:
        if not request.request_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id: empty")
        try:
            params = sampling_from_wire(request.sampling, self.vocab_size)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{e}")
        guide = await self._guide(params, (), context)
        try:
            self.engine.generate(request.request_id, list(request.prompt_token_ids), params, sink, guide)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def _relay(self, rid: str, stream: EventStream):
        """Token events of rid as TokenBatches until it finishes; aborts it if the caller leaves."""
        finished = False
        try:
            while not finished:
                batch = worker_pb2.TokenBatch()
                for ev in await stream.next_batch():
                    finished = add_event(batch, ev) or finished
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
