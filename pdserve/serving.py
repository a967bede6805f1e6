"""Pieces every pdserve service shares: server setup, health, shutdown, wire conversions."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.core.sampling import Guide, GuideKind, SamplingParams, ValidationError
from pdserve.core.step_io import TokenLogprobs
from pdserve.proto import worker_pb2

MAX_MESSAGE_BYTES = 64 << 20
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]

# Servers accept the gateway's keepalive pings (every 2 s, even without calls).
SERVER_KEEPALIVE = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
]

log = logging.getLogger(__name__)


def sampling_to_wire(p: SamplingParams) -> worker_pb2.WorkerSampling:
    w = worker_pb2.WorkerSampling(
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        max_tokens=p.max_tokens,
        min_tokens=p.min_tokens,
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        min_p=p.min_p,
        logit_bias=dict(p.logit_bias),
        priority=p.priority,
    )
    if p.repetition_penalty != 1.0:
        w.repetition_penalty = p.repetition_penalty
    if p.seed is not None:
        w.seed = p.seed
    if p.logprobs is not None:
        w.logprobs = p.logprobs
    if p.prompt_logprobs is not None:
        w.prompt_logprobs = p.prompt_logprobs
    if p.guide is not None:
        w.guide.kind = _GUIDE_TO_WIRE[p.guide.kind]
        w.guide.value = p.guide.value
        w.guide.reasoning = p.guide.reasoning
    return w


_GUIDE_TO_WIRE = {
    GuideKind.JSON: worker_pb2.WorkerGuide.KIND_JSON, GuideKind.REGEX: worker_pb2.WorkerGuide.KIND_REGEX,
    GuideKind.CHOICE: worker_pb2.WorkerGuide.KIND_CHOICE, GuideKind.GRAMMAR: worker_pb2.WorkerGuide.KIND_GRAMMAR,
}
_GUIDE_FROM_WIRE = {v: k for k, v in _GUIDE_TO_WIRE.items()}


def _guide_from_wire(w: worker_pb2.WorkerSampling) -> Guide | None:
    if not w.HasField("guide"):
        return None
    kind = _GUIDE_FROM_WIRE.get(w.guide.kind)
    if kind is None:
        raise ValidationError("guide", f"unknown kind {w.guide.kind}")
    return Guide(kind, w.guide.value, w.guide.reasoning)


def sampling_from_wire(w: worker_pb2.WorkerSampling, vocab_size: int | None = None) -> SamplingParams:
    p = SamplingParams(
        temperature=w.temperature,
        top_p=w.top_p,
        top_k=w.top_k,
        seed=w.seed if w.HasField("seed") else None,
        max_tokens=w.max_tokens,
        min_tokens=w.min_tokens,
        stop_token_ids=tuple(w.stop_token_ids),
        ignore_eos=w.ignore_eos,
        logprobs=w.logprobs if w.HasField("logprobs") else None,
        presence_penalty=w.presence_penalty,
        frequency_penalty=w.frequency_penalty,
        repetition_penalty=w.repetition_penalty if w.HasField("repetition_penalty") else 1.0,
        min_p=w.min_p,
        logit_bias=tuple(sorted(w.logit_bias.items())),
        prompt_logprobs=w.prompt_logprobs if w.HasField("prompt_logprobs") else None,
        guide=_guide_from_wire(w),
        priority=w.priority,
    )
    p.validate(vocab_size)
    return p


def logprobs_to_wire(lp: TokenLogprobs, out: worker_pb2.WorkerLogprobs) -> None:
    """Fill `out` (a new message or a repeated field's added one) from lp."""
    out.logprob = lp.logprob
    out.top_token_ids.extend(t for t, _ in lp.top)
    out.top_logprobs.extend(v for _, v in lp.top)
    if lp.rank is not None:
        out.rank = lp.rank


def new_server(reuse_port: bool = False, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> grpc.aio.Server:
    """A grpc.aio server; reuse_port lets several processes bind one port (SO_REUSEPORT), which is
    off by default so that a second server on a taken port fails instead of sharing it."""
    options = [o for o in GRPC_OPTIONS if o[0] != "grpc.so_reuseport"] + [("grpc.so_reuseport", int(reuse_port))]
    return grpc.aio.server(options=options + SERVER_KEEPALIVE, interceptors=list(interceptors) or None)


def add_health(server: grpc.aio.Server, services: list[str]) -> health.aio.HealthServicer:
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


async def set_serving(servicer: health.aio.HealthServicer, services: list[str], ok: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ["", *services]:
        await servicer.set(name, status)


async def serve(
    server: grpc.aio.Server,
    address: str,
    health_servicer: health.aio.HealthServicer,
    services: list[str],
    on_stop: Callable[[], Awaitable[None]] | None = None,
    drain_seconds: float = 5.0,
    on_start: Callable[[], Awaitable[None]] | None = None,
    drain: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Bind, serve until SIGTERM/SIGINT, then report NOT_SERVING and drain.

    on_start runs before READY is printed (e.g. binding another listener); drain runs after
    NOT_SERVING and before the server stops (e.g. waiting for in-flight requests).
    """
    port = server.add_insecure_port(address)
    if port == 0:
        raise SystemExit(f"cannot bind {address}")
    await server.start()
    if on_start is not None:
        await on_start()
    await set_serving(health_servicer, services, True)
    log.info("listening on %s", address)
    print(f"READY {address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(server.wait_for_termination())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
    await set_serving(health_servicer, services, False)
    if drain is not None:
        await drain()
    await server.stop(drain_seconds)
    if on_stop is not None:
        await on_stop()


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [trace=%(trace_id)s req=%(request_id)s]: %(message)s"


def setup_logging(level: str = "INFO") -> None:
    """Root logging; every record carries the trace id and request id (- when none)."""
    from pdserve.telemetry import TraceLogFilter

    logging.basicConfig(level=level, format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(TraceLogFilter())


def setup_observability(args, service: str) -> bool:
    """Tracing from --otlp-traces-endpoint / OTEL_* for service; call once from a main."""
    from pdserve.telemetry import setup

    return setup(service, getattr(args, "otlp_traces_endpoint", None))


def run_service(args, amain: Callable[..., Awaitable[None]], service_name: str) -> None:
    """The body of every service's main(): logging, tracing/metrics setup, then the event loop."""
    setup_logging(args.log_level)
    setup_observability(args, service_name)
    asyncio.run(amain(args))
