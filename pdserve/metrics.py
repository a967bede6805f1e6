"""Prometheus metrics (`--metrics-port`; 0 or absent = no endpoint), names close to vLLM's.

Each service builds its own registry in its main (nothing is registered at import). The
gateway observes per-request latencies; a worker's queue, batch and KV-pool figures are read
from its scheduler when scraped, so the engine loop does no metrics work per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pdserve.core.speculative import SpecStats

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
