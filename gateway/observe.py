"""What the gateway records per request: the root span `gateway.generate` and the latency metrics."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from gateway.errors import GatewayError
from pdserve.metrics import GatewayMetrics
from pdserve.proto import gateway_pb2
from pdserve.telemetry import tracer

FINISH_NAMES = {gateway_pb2.FINISH_REASON_STOP: "stop", gateway_pb2.FINISH_REASON_LENGTH: "length",
                gateway_pb2.FINISH_REASON_ABORT: "abort"}


class RequestObserver:
    """Follows one Generate stream: timings for the histograms, attributes for the span."""

    def __init__(self, metrics: GatewayMetrics | None, span: trace.Span) -> None:
        self.metrics = metrics
        self.span = span
        self.t0 = time.perf_counter()
        self.first: float | None = None
        self.last = self.t0
        self.tokens = 0

    def chunk(self, n: int) -> None:
        """n new tokens arrived."""
        now = time.perf_counter()
        if self.first is None:
            self.first = now
            if self.metrics:
                self.metrics.ttft.observe(now - self.t0)
            self.span.set_attribute("pdserve.ttft_ms", (now - self.t0) * 1000)
        elif self.metrics and n:
            for _ in range(n):
                self.metrics.itl.observe((now - self.last) / n)
        self.last = now
        self.tokens += n

    def complete(self, done: gateway_pb2.Complete) -> None:
        """The stream's last message: usage, finish reason, request id; end-of-request metrics."""
        now = time.perf_counter()
        self.span.set_attributes({
            "gen_ai.usage.input_tokens": done.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": done.usage.completion_tokens,
            "gen_ai.response.finish_reasons": [FINISH_NAMES.get(done.finish_reason, "unknown")],
            "pdserve.request_id": done.request_id,
        })
        if self.metrics:
            self.metrics.e2e.observe(now - self.t0)
            if self.first is not None and done.usage.completion_tokens > 1:
                self.metrics.tpot.observe((now - self.first) / (done.usage.completion_tokens - 1))

    def error(self, code: grpc.StatusCode | None) -> None:
        """The request failed with code (None: an unexpected exception)."""
        name = code.name if code is not None else "UNKNOWN"
        if self.metrics:
            self.metrics.errors.labels(code=name).inc()
        self.span.set_status(Status(StatusCode.ERROR, name))
        self.span.set_attribute("rpc.grpc.status_code", name)


def request_attributes(request, model: str) -> dict:
    """gen_ai.request.* attributes of a GenerateRequest (those it sets)."""
    attrs: dict = {"gen_ai.operation.name": "text_completion", "gen_ai.request.model": request.model or model}
    s = getattr(request, "sampling", None)
    if s is not None:
        attrs["gen_ai.request.max_tokens"] = s.max_tokens if s.HasField("max_tokens") else 16
        attrs["gen_ai.request.temperature"] = s.temperature if s.HasField("temperature") else 1.0
    return attrs


async def observed(stream: AsyncIterator[gateway_pb2.GenerateResponse], request, model: str,
                   parent: otel_context.Context, metrics: GatewayMetrics | None):
    """Relay stream inside a `gateway.generate` span, child of parent (the caller's trace context)."""
    attrs = request_attributes(request, model) if isinstance(request, gateway_pb2.GenerateRequest) else {}
    with tracer().start_as_current_span("gateway.generate", context=parent,
                                        kind=trace.SpanKind.SERVER, attributes=attrs,
                                        record_exception=False, set_status_on_exception=False) as span:
        obs = RequestObserver(metrics, span)
        try:
            async for resp in stream:
                if resp.HasField("chunk"):
                    obs.chunk(len(resp.chunk.token_ids))
                elif resp.HasField("complete"):
                    obs.complete(resp.complete)
                yield resp
        except GatewayError as e:
            obs.error(e.code)
            raise
        except Exception as e:
            obs.error(None)
            span.record_exception(e)
            raise
