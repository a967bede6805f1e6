"""Decode-side spans: `decode.wait_kv` (Reserve -> KV complete at Decode) and `decode.generate`."""

from __future__ import annotations

import time

import grpc
from opentelemetry import trace

from pdserve.telemetry import incoming_context, tracer, tracing_enabled

MAX_TRACKED = 65536  # reservations whose Decode never came (lease expired) are dropped past this


class DecodeSpans:
    """Remembers when each reservation was made, only while tracing is on."""

    def __init__(self) -> None:
        self.on = tracing_enabled()
        self._reserved_at: dict[str, int] = {}

    def reserved(self, request_id: str) -> None:
        """A reservation was made now."""
        if self.on:
            if len(self._reserved_at) >= MAX_TRACKED:
                self._reserved_at.clear()
            self._reserved_at[request_id] = time.time_ns()

    def forget(self, request_id: str) -> None:
        """The reservation was aborted."""
        self._reserved_at.pop(request_id, None)

    def started(self, request_id: str, context: grpc.aio.ServicerContext) -> trace.Span:
        """The KV is in and decoding starts: ends decode.wait_kv, returns decode.generate (open)."""
        if not self.on:
            return trace.INVALID_SPAN
        parent = incoming_context(context)
        reserved_at = self._reserved_at.pop(request_id, None)
        attrs = {"pdserve.request_id": request_id}
        if reserved_at is not None:
            tracer().start_span("decode.wait_kv", context=parent, start_time=reserved_at,
                                attributes=attrs).end()
        return tracer().start_span("decode.generate", context=parent, attributes=attrs)
