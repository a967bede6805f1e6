"""gRPC face of the prefill worker: Prefill (returns the first token), Abort, GetStats."""

from __future__ import annotations

import logging

import grpc

from pdserve.core.block_manager import cacheable_blocks
from pdserve.core.kv_layout import KvLayout
from pdserve.core.sampling import ValidationError
from pdserve.proto import worker_pb2, worker_pb2_grpc
from pdserve.metrics import WorkerMetrics
from pdserve.serving import logprobs_to_wire, sampling_from_wire
from pdserve.telemetry import remote_parent
from pdserve.transfer.base import KvTargetSpec, LayoutMismatch, TransferError, layout_to_proto
from prefill_service.engine import PrefillAborted, PrefillEngine

log = logging.getLogger(__name__)


class PrefillServicer(worker_pb2_grpc.PrefillWorkerServicer):
    def __init__(self, engine: PrefillEngine, layout: KvLayout, vocab_size: int, model: str) -> None:
        self.engine = engine
        self.layout = layout
        self.vocab_size = vocab_size
        self.model = model
        self.metrics: WorkerMetrics | None = None  # set by main when metrics are on

    async def Prefill(self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext) -> worker_pb2.PrefillResponse:
        prompt = list(request.prompt_token_ids)
        try:
            params = sampling_from_wire(request.sampling, self.vocab_size)
        except ValueError as e:  # ValidationError names the field
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{e}")
        error = self._check(request, prompt)
        if error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)
        t = request.target
        target = KvTargetSpec(t.request_id, tuple(t.block_ids), t.address, t.layout.hash, t.backend)
        remaining = context.time_remaining()
        timeout = 30.0 if remaining is None else max(0.1, remaining)
        try:
            with remote_parent(context):
                first, stats, cached = await self.engine.prefill(request.request_id, prompt, params, target, timeout,
                                                                 t.cached_tokens)
            if self.metrics is not None:
                self.metrics.transfer(stats.bytes, stats.seconds)
        except LayoutMismatch as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except TransferError as e:
            code = grpc.StatusCode.UNAVAILABLE if e.retryable else grpc.StatusCode.INTERNAL
            await context.abort(code, f"KV transfer failed: {e}")
        except PrefillAborted as e:
            await context.abort(grpc.StatusCode.ABORTED, str(e))
        except ValidationError as e:  # the guide: refused before anything started
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{e}")
        resp = worker_pb2.PrefillResponse(
            first_token=first.token, kv_bytes=stats.bytes, kv_transfer_ms=stats.seconds * 1000, cached_tokens=cached
        )
        if first.logprobs is not None:
            logprobs_to_wire(first.logprobs, resp.first_logprobs)
        for lp in first.prompt_logprobs or ():
            logprobs_to_wire(lp, resp.prompt_logprobs.add())
        return resp

    def _check(self, request: worker_pb2.PrefillRequest, prompt: list[int]) -> str | None:
        sched = self.engine.loop.scheduler
        if not request.request_id:
            return "request_id: empty"
        if not prompt:
            return "prompt_token_ids: empty"
        if len(prompt) >= sched.cfg.max_model_len:
            return f"prompt_token_ids: {len(prompt)} tokens, max_model_len is {sched.cfg.max_model_len}"
        if max(prompt) >= self.vocab_size:
            return f"prompt_token_ids: token {max(prompt)} outside the vocabulary"
        if request.target.request_id != request.request_id:
            return "target.request_id: does not match request_id"
        size, cached = sched.blocks.block_size, request.target.cached_tokens
        if cached % size or cached > cacheable_blocks(len(prompt), size) * size:
            return (f"target.cached_tokens: {cached} is not a whole number of {size}-token blocks before "
                    f"the block of the last of {len(prompt)} prompt tokens")
        need = sched.blocks.blocks_for(len(prompt)) - cached // size
        if len(request.target.block_ids) != need:
            return (f"target.block_ids: {len(request.target.block_ids)} blocks for a prompt needing {need} "
                    f"after {cached} cached tokens")
        return None

    async def Abort(self, request: worker_pb2.AbortRequest, context: grpc.aio.ServicerContext) -> worker_pb2.AbortResponse:
        return worker_pb2.AbortResponse(found=self.engine.abort(request.request_id))

    async def GetStats(self, request: worker_pb2.StatsRequest, context: grpc.aio.ServicerContext) -> worker_pb2.WorkerStats:
        loop = self.engine.loop
        sched = loop.scheduler
        with loop.lock:
            return worker_pb2.WorkerStats(
                role="prefill", free_blocks=sched.blocks.num_free, total_blocks=sched.blocks.num_total,
                running=len(sched.running), waiting=len(sched.waiting), queued_tokens=sched.queued_tokens,
                layout=layout_to_proto(self.layout), model=self.model, max_model_len=sched.cfg.max_model_len,
                prefix_cache_hits=sched.prefix_hit_tokens, preemptions=sched.preemptions,
            )
