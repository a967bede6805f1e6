"""OpenTelemetry tracing for the three services: setup, W3C context over gRPC metadata, logs.

Tracing is on when one of these is set, and off otherwise (the API's no-op tracer, no
exporter, no per-token work):

- `--otlp-traces-endpoint URL` or `OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT`: OTLP over gRPC;
- `OTEL_TRACES_EXPORTER` listing `otlp` and/or `console`;
- `PDSERVE_TRACE_FILE=path`: every finished span as one JSON line appended to path (tests).

`OTEL_SDK_DISABLED=true` turns it off whatever else is set. `OTEL_SERVICE_NAME` overrides
the service name (pdserve-gateway / pdserve-prefill / pdserve-decode), for traces and OTLP
metrics alike (`service_resource`). `setup` is called once from each service's main, never at
import. Metrics export lives in `pdserve.metrics` / `pdserve.otlp_metrics`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Sequence

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor,
                                            SpanExporter, SpanExportResult)

INSTRUMENTATION = "pdserve"


def tracer() -> trace.Tracer:
    """The pdserve tracer of the global provider (a no-op tracer while tracing is off)."""
    return trace.get_tracer(INSTRUMENTATION)


def tracing_enabled() -> bool:
    """True once `setup` installed an SDK provider in this process."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to a file as one JSON object per line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_to_dict(s)) + "\n" for s in spans)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing held open between exports."""


def span_to_dict(span: ReadableSpan) -> dict:
    """The fields a test or a reader needs: ids as hex, parent, links, attributes, times."""
    ctx = span.get_span_context()
    return {
        "name": span.name,
        "service": span.resource.attributes.get("service.name"),
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
        "links": [{"trace_id": f"{ln.context.trace_id:032x}", "span_id": f"{ln.context.span_id:016x}"}
                  for ln in span.links],
        "status": span.status.status_code.name,
    }


def _exporters(endpoint: str | None) -> list[tuple[SpanExporter, bool]]:
    """(exporter, batched) pairs chosen by the flag and the environment."""
    env = os.environ
    wanted = {e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    out: list[tuple[SpanExporter, bool]] = []
    if env.get("PDSERVE_TRACE_FILE"):
        out.append((JsonLinesExporter(env["PDSERVE_TRACE_FILE"]), False))
    if "console" in wanted:
        out.append((ConsoleSpanExporter(), False))
    endpoint = endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint or "otlp" in wanted:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        out.append((OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter(), True))
    return out


def service_resource(service: str) -> Resource:
    """The resource of a service's spans and metrics: service.name is OTEL_SERVICE_NAME or service
    (plus OTEL_RESOURCE_ATTRIBUTES)."""
    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service})


def setup(service: str, endpoint: str | None = None) -> bool:
    """Install the global tracer provider for service when an exporter is configured.

    Returns whether tracing is on. Spans are flushed at interpreter exit.
    """
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporters = _exporters(endpoint)
    if not exporters:
        return False
    resource = service_resource(service)
    name = resource.attributes["service.name"]
    provider = TracerProvider(resource=resource)
    for exporter, batched in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter) if batched else SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    logging.getLogger(__name__).info("tracing on: service %s, %d exporter(s)", name, len(exporters))
    return True


# --- W3C trace context over gRPC -------------------------------------------------------------

def outgoing_metadata() -> list[tuple[str, str]]:
    """traceparent/tracestate of the current span as gRPC metadata (empty when tracing is off)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())


def incoming_context(context: grpc.aio.ServicerContext) -> otel_context.Context:
    """The caller's trace context, taken from the request's metadata."""
    md = context.invocation_metadata() or ()
    return propagate.extract({k: v for k, v in md if isinstance(v, str)})


@contextlib.contextmanager
def remote_parent(context: grpc.aio.ServicerContext) -> Iterator[None]:
    """Make the caller's span current for the body (a unary handler: no yields inside)."""
    token = otel_context.attach(incoming_context(context))
    try:
        yield
    finally:
        otel_context.detach(token)


def _with_trace(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    """details with the current trace context added to its metadata."""
    extra = outgoing_metadata()
    if not extra:
        return details
    md = grpc.aio.Metadata(*(details.metadata or ()), *extra)
    return grpc.aio.ClientCallDetails(details.method, details.timeout, md, details.credentials,
                                      details.wait_for_ready)


class UnaryTracePropagator(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds the current trace context to unary calls (Reserve, Prefill, Abort)."""

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        """Call on with traceparent in the metadata."""
        return await continuation(_with_trace(client_call_details), request)


class StreamTracePropagator(grpc.aio.UnaryStreamClientInterceptor):
    """Adds the current trace context to server-streaming calls (Decode, Generate)."""

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        """Call on with traceparent in the metadata."""
        return await continuation(_with_trace(client_call_details), request)


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """Interceptors for a worker channel (grpc.aio files each under one kind: one per kind);
    none while tracing is off."""
    return [UnaryTracePropagator(), StreamTracePropagator()] if tracing_enabled() else []


# --- logs ------------------------------------------------------------------------------------

class TraceLogFilter(logging.Filter):
    """Gives every record `trace_id` (current span, or -) and `request_id` (or -)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = f"{ctx.trace_id:032x}" if ctx.is_valid else "-"
        if not hasattr(record, "request_id"):
            record.request_id = "-"
        return True


def request_logger(logger: logging.Logger, request_id: str) -> logging.LoggerAdapter:
    """A logger whose records carry request_id (shown by the format of `setup_logging`)."""
    return logging.LoggerAdapter(logger, {"request_id": request_id})
