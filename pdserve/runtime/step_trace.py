"""Spans of the engine thread: per-request queue time and one span per batched forward.

Only built while tracing is on (the loop keeps `step_tracer = None` otherwise). The request's
span context is captured on `submitted` (called on the RPC's thread, where that context is
current); the engine thread then creates finished spans with explicit times, so nothing here
waits or exports inline beyond what the span processor does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext

from pdserve.core.step_io import StepInput


@dataclass
class _Entry:
    ctx: SpanContext
    queued_ns: int
    scheduled: bool = False


class StepTracer:
    """`<role>.queue` per request (submit -> first step) and `<role>.forward` per step."""

    def __init__(self, role: str, tracer: trace.Tracer | None = None) -> None:
        self.queue_name = f"{role}.queue"
        self.forward_name = f"{role}.forward"
        self._tracer = tracer or trace.get_tracer("pdserve.engine")
        self._entries: dict[str, _Entry] = {}

    def submitted(self, request_id: str) -> None:
        """Remember the current span context of the submitting RPC (if it has one)."""
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            self._entries[request_id] = _Entry(ctx, time.time_ns())

    def forget(self, request_id: str) -> None:
        """The request finished or was aborted."""
        self._entries.pop(request_id, None)

    def step(self, step: StepInput, start_ns: int, end_ns: int, ok: bool) -> None:
        """Record one executed step: queue spans for newcomers, one forward span with links."""
        served = [(sl, self._entries.get(sl.request_id)) for sl in step.seqs]
        served = [(sl, e) for sl, e in served if e is not None]
        if not served:
            return
        for sl, e in served:
            if not e.scheduled:
                e.scheduled = True
                self._span(self.queue_name, e.ctx, e.queued_ns, start_ns, {"pdserve.request_id": sl.request_id})
        tokens = sum(sl.end_pos - sl.start_pos for sl in step.seqs)
        attrs = {"pdserve.batch.requests": len(step.seqs), "pdserve.batch.tokens": tokens,
                 "pdserve.batch.request_ids": [sl.request_id for sl, _ in served], "pdserve.step.ok": ok}
        links = [Link(e.ctx) for _, e in served]
        self._span(self.forward_name, served[0][1].ctx, start_ns, end_ns, attrs, links)

    def _span(self, name: str, parent: SpanContext, start_ns: int, end_ns: int, attrs: dict,
              links: list[Link] | None = None) -> None:
        ctx = trace.set_span_in_context(NonRecordingSpan(parent))
        span = self._tracer.start_span(name, context=ctx, start_time=start_ns, attributes=attrs, links=links)
        span.end(end_time=end_ns)
