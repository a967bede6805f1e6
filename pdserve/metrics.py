"""Metrics, names close to vLLM's: a Prometheus endpoint (`--metrics-port`; 0 or absent = none)
and OTLP export of the same registry (`--otlp-metrics-endpoint` or OTEL_* variables; off by default).

Each service builds its own registry in its main (nothing is registered at import). The
gateway observes per-request latencies; a worker's queue, batch and KV-pool figures are read
from its scheduler when scraped or exported, so the engine loop does no metrics work per step.
The registry is the one source of truth: `pdserve.otlp_metrics` converts its snapshot to OTLP
and is imported only when OTLP export is on.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pdserve.core.speculative import SpecStats

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)


class GatewayMetrics:
    """TTFT, TPOT, ITL and end-to-end histograms, and errors by gRPC status code."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        hist = lambda name, doc: Histogram(name, doc, registry=self.registry, buckets=LATENCY_BUCKETS)  # noqa: E731
        self.ttft = hist("pdserve:time_to_first_token_seconds", "Time to first token.")
        self.tpot = hist("pdserve:time_per_output_token_seconds", "Mean time per output token after the first.")
        self.itl = hist("pdserve:inter_token_latency_seconds", "Time between consecutive output tokens.")
        self.e2e = hist("pdserve:e2e_request_latency_seconds", "End-to-end request latency.")
        self.errors = Counter("pdserve:request_errors", "Failed requests by gRPC status code.", ["code"],
                              registry=self.registry)


class WorkerMetrics:
    """KV transfer bytes and latency (prefill side), plus a scheduler collector."""

    def __init__(self, loop, extra_waiting: Callable[[], int] | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.kv_bytes = Counter("pdserve:kv_transfer_bytes", "KV bytes sent to decode workers.",
                                registry=self.registry)
        self.kv_seconds = Histogram("pdserve:kv_transfer_seconds", "KV transfer time per request.",
                                    registry=self.registry, buckets=LATENCY_BUCKETS)
        self.registry.register(SchedulerCollector(loop, extra_waiting))

    def transfer(self, nbytes: int, seconds: float) -> None:
        """One finished KV transfer."""
        self.kv_bytes.inc(nbytes)
        self.kv_seconds.observe(seconds)


class SchedulerCollector(Collector):
    """Reads queue depth, running sequences, KV usage, prefix hits and preemptions on scrape."""

    def __init__(self, loop, extra_waiting: Callable[[], int] | None = None) -> None:
        self.loop = loop
        self.extra_waiting = extra_waiting

    def collect(self) -> Iterable[Metric]:
        sched = self.loop.scheduler
        with self.loop.lock:
            waiting = len(sched.waiting) + (self.extra_waiting() if self.extra_waiting else 0)
            running = len(sched.running)
            free, total = sched.blocks.num_free, sched.blocks.num_total
            hits, preemptions = sched.prefix_hit_tokens, sched.preemptions
            spec = getattr(sched, "spec", None)
            spec_stats = None if spec is None else dataclasses.replace(
                spec.stats, accepted_per_pos=list(spec.stats.accepted_per_pos))
        yield GaugeMetricFamily("pdserve:num_requests_waiting", "Requests waiting (incl. KV reservations).",
                                value=waiting)
        yield GaugeMetricFamily("pdserve:num_requests_running", "Sequences in the running batch.", value=running)
        yield GaugeMetricFamily("pdserve:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).",
                                value=1.0 - free / total if total else 0.0)
        yield CounterMetricFamily("pdserve:prefix_cache_hits", "Prompt tokens served from the prefix cache.",
                                  value=hits)
        yield CounterMetricFamily("pdserve:num_preemptions", "Sequences preempted (recompute).", value=preemptions)
        if spec_stats is not None:
            yield from spec_metrics(spec_stats)


def spec_metrics(st: SpecStats) -> Iterable[Metric]:
    """Speculative decoding counters, as vLLM's spec_decode_* (the _total suffix is added)."""
    yield CounterMetricFamily("pdserve:spec_decode_num_drafts", "Sequence-steps that verified drafts.",
                              value=st.steps)
    yield CounterMetricFamily("pdserve:spec_decode_num_draft_tokens", "Draft tokens verified.",
                              value=st.proposed)
    yield CounterMetricFamily("pdserve:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                              value=st.accepted)
    per_pos = CounterMetricFamily("pdserve:spec_decode_num_accepted_tokens_per_pos",
                                  "Draft tokens accepted, by offset in the draft.", labels=["position"])
    for i, n in enumerate(st.accepted_per_pos):
        per_pos.add_metric([str(i)], n)
    yield per_pos


def serve(port: int | None, registry: CollectorRegistry, host: str = "0.0.0.0") -> bool:
    """Start the Prometheus endpoint on port (a daemon thread); False when port is 0/None."""
    if not port:
        return False
    start_http_server(port, addr=host, registry=registry)
    return True


def serve_worker(port: int | None, loop, extra_waiting: Callable[[], int] | None = None,
                 host: str = "0.0.0.0") -> WorkerMetrics:
    """A worker's metrics, served on port when it is set."""
    m = WorkerMetrics(loop, extra_waiting)
    serve(port, m.registry, host)
    return m


# --- OTLP export (the same registry, pushed) ---------------------------------------------------


@dataclass(frozen=True)
class OtlpMetricsConfig:
    """Where and how often a service pushes its registry over OTLP/gRPC."""

    endpoint: str | None  # None: the exporter's own default (localhost:4317)
    interval_s: float = 60.0


class MetricsExport(Protocol):
    """A running exporter; `shutdown` pushes one last snapshot and stops it."""

    def shutdown(self) -> None: ...


def add_otlp_metrics_arg(p: argparse.ArgumentParser) -> None:
    """The `--otlp-metrics-endpoint` flag of every service."""
    p.add_argument("--otlp-metrics-endpoint", default=None,
                   help="OTLP/gRPC collector for metrics, e.g. http://otel-collector:4317 (else OTEL_* env vars)")


def otlp_metrics_config(endpoint: str | None = None,
                        env: Mapping[str, str] | None = None) -> OtlpMetricsConfig | None:
    """The OTLP metrics settings from the flag and the standard variables; None when export is off.

    On with the flag, `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT` or
    `OTEL_METRICS_EXPORTER` listing `otlp`; `OTEL_METRICS_EXPORTER=none` turns the variables
    (not the flag) off and `OTEL_SDK_DISABLED=true` turns everything off.
    `OTEL_METRIC_EXPORT_INTERVAL` is in milliseconds (default 60000).
    """
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    wanted = {e.strip().lower() for e in env.get("OTEL_METRICS_EXPORTER", "").split(",") if e.strip()}
    if not endpoint:
        if "none" in wanted:
            return None
        endpoint = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if not endpoint and "otlp" not in wanted:
            return None
    raw = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    try:
        interval_ms = float(raw) if raw else 60_000.0
    except ValueError:
        interval_ms = -1.0
    if not (math.isfinite(interval_ms) and interval_ms > 0):
        raise ValueError(f"OTEL_METRIC_EXPORT_INTERVAL must be a positive number of milliseconds, got {raw!r}")
    return OtlpMetricsConfig(endpoint or None, interval_ms / 1000.0)


def export_otlp(endpoint: str | None, registry: CollectorRegistry, service: str) -> MetricsExport | None:
    """Start pushing registry over OTLP when configured (see `otlp_metrics_config`); None when off.

    Nothing of OpenTelemetry's metrics SDK or exporter is imported while export is off.
    """
    try:
        config = otlp_metrics_config(endpoint)
    except ValueError as e:
        raise SystemExit(f"{service}: {e}") from None
    if config is None:
        return None
    try:
        from pdserve.otlp_metrics import start_exporter
    except ImportError as e:
        raise SystemExit(f"{service}: OTLP metrics need opentelemetry-sdk and "
                         f"opentelemetry-exporter-otlp-proto-grpc ({e})") from None
    exporter = start_exporter(registry, service, config)
    log.info("OTLP metrics on: %s every %.3g s", config.endpoint or "default endpoint", config.interval_s)
    return exporter
