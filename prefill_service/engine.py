"""Prefill worker engine: batched prompts, KV pushed layer by layer, first token returned."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from pdserve.core.request import Finish, Sequence
from pdserve.core.scheduler import TokenEvent
from pdserve.core.sampling import SamplingParams
from pdserve.guided import GuideCompiler, follow
from pdserve.core.step_io import StepInput
from pdserve.runtime.loop import EngineLoop, LayerHook
from pdserve.runtime.step_trace import StepTracer
from pdserve.telemetry import tracer, tracing_enabled
from pdserve.streams import EventStream
from pdserve.transfer.base import KvSender, KvTargetSpec, SendHandle, TransferError, TransferStats

log = logging.getLogger(__name__)


class PrefillAborted(RuntimeError):
    """The request was aborted (by a caller or a failed step) before its first token."""


class PrefillEngine:
    """Runs prompts through the shared engine loop and ships their KV to the decode side."""

    def __init__(self, sender: KvSender, eos_ids: tuple[int, ...], guides: GuideCompiler | None = None) -> None:
        self.sender = sender
        self.eos_ids = eos_ids
        self.guides = guides  # structured output's grammars (None: the model has no tokenizer.json)
        self.loop: EngineLoop | None = None
        self._handles: dict[str, SendHandle] = {}
        self._pushing: set[str] = set()  # requests whose first slice was scheduled
        self._skip: dict[str, int] = {}  # leading blocks the decode side has cached: not sent
        self._settling: set[asyncio.Future] = set()  # acks of sealed transfers still awaited

    def attach(self, loop: EngineLoop) -> None:
        """Use loop; while tracing is on it records prefill.queue / prefill.forward spans."""
        self.loop = loop
        if tracing_enabled():
            loop.step_tracer = StepTracer("prefill")

    def hook_for_step(self, step: StepInput) -> LayerHook | None:
        """Called on the engine thread before each forward: which blocks to push per layer."""
        size = self.loop.scheduler.blocks.block_size
        pushes = []
        for sl in step.seqs:
            handle = self._handles.get(sl.request_id)
            if handle is None:
                continue
            # Target block i is prompt block skip + i (the decode side has the first `skip`).
            # The first slice also ships the blocks found in this worker's prefix cache: they
            # are complete, so every layer goes at once, before the forward.
            skip = self._skip.get(sl.request_id, 0)
            first = max(sl.start_pos // size, skip)
            if sl.request_id not in self._pushing and first > skip:
                handle.push_all_layers(sl.block_table[skip:first], 0)
            self._pushing.add(sl.request_id)
            last = (sl.end_pos - 1) // size
            if last >= first:
                pushes.append((handle, sl.block_table[first : last + 1], first - skip))
        if not pushes:
            return None

        def hook(layer: int) -> None:
            for handle, blocks, offset in pushes:
                handle.push(layer, blocks, offset)

        return hook

    async def prefill(
        self, request_id: str, prompt: list[int], params: SamplingParams, target: KvTargetSpec, timeout: float,
        remote_cached_tokens: int = 0,
    ) -> tuple[TokenEvent, TransferStats, int]:
        """First token (with its logprobs if asked), transfer stats and prefix-cached tokens; the KV is visible remotely on
        return (the handle is sealed; the receiver's ack is awaited off this path: _settle).

        The decode side already holds the first `remote_cached_tokens` (whole blocks) of the
        prompt: target.block_ids are the blocks after them, and only those are sent.
        ValidationError (naming `guide`) before anything starts when params.guide cannot be followed."""
        guide = await follow(self.guides, params)
        t_start = time.time_ns()
        handle = await asyncio.to_thread(self.sender.start, target, self.loop.runner.kv_pool)
        self._skip[request_id] = remote_cached_tokens // self.loop.scheduler.blocks.block_size
        self._handles[request_id] = handle
        stream = EventStream()
        seq = Sequence(request_id, list(prompt), dataclasses.replace(params, max_tokens=1), self.eos_ids, guide=guide)
        done = False
        try:
            self.loop.submit(seq, stream.sink)
            event = (await stream.next_batch())[0]
            done = True
            if event.finish is Finish.ABORT or event.token < 0:
                raise PrefillAborted(f"request {request_id} was aborted during prefill")
            stats = await asyncio.to_thread(handle.seal, timeout)
            self._settle(request_id, handle, timeout)
            _transfer_span(t_start, stats, len(target.block_ids), target.backend)
            return event, stats, seq.num_cached
        except (TransferError, PrefillAborted, asyncio.CancelledError):
            handle.abort()
            raise
        finally:
            self._handles.pop(request_id, None)
            self._pushing.discard(request_id)
            self._skip.pop(request_id, None)
            if not done:
                self.loop.abort(request_id)

    def _settle(self, request_id: str, handle: SendHandle, timeout: float) -> None:
        """Wait for the receiver's ack of a sealed transfer in the background. A failure here
        (the decode side refused the summary) cannot reach the caller any more; the decode
        worker, which never saw the transfer complete, fails the request's Decode."""
        task = asyncio.ensure_future(asyncio.to_thread(handle.finish, timeout))
        self._settling.add(task)

        def done(t: asyncio.Future) -> None:
            self._settling.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("KV transfer of %s sealed but not acknowledged: %s", request_id, t.exception())

        task.add_done_callback(done)

    def abort(self, request_id: str) -> bool:
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.abort()
        return self.loop.abort(request_id)


def _transfer_span(start_ns: int, stats: TransferStats, blocks: int, backend: str) -> None:
    """`kv.transfer`: from opening the send until every byte is visible to the decode side
    (seal: the receiver's ack, or for cuda_ipc its copies landed)."""
    gbps = stats.bytes / stats.seconds / 1e9 if stats.seconds > 0 else 0.0
    span = tracer().start_span("kv.transfer", start_time=start_ns, attributes={
        "pdserve.kv.bytes": stats.bytes, "pdserve.kv.blocks": blocks, "pdserve.kv.backend": backend,
        "pdserve.kv.gbps": gbps, "pdserve.kv.chunks": stats.chunks, "pdserve.kv.seconds": stats.seconds})
    span.end()
