"""OTLP metrics: the registry -> MetricsData conversion, the settings from flags and OTEL_* variables,
and the periodic exporter against a real OTLP/gRPC receiver on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pdserve import metrics
from pdserve.otlp_metrics import PeriodicExporter, otlp_name, to_metrics_data
from pdserve.telemetry import service_resource
from pdtest.otlp import MetricsReceiver, find

# Prometheus family -> (OTLP name, unit): the documented mapping of every pdserve metric.
NAMES = {
    "pdserve:time_to_first_token_seconds": ("pdserve.time_to_first_token", "s"),
    "pdserve:time_per_output_token_seconds": ("pdserve.time_per_output_token", "s"),
    "pdserve:inter_token_latency_seconds": ("pdserve.inter_token_latency", "s"),
    "pdserve:e2e_request_latency_seconds": ("pdserve.e2e_request_latency", "s"),
    "pdserve:request_errors": ("pdserve.request_errors", ""),
    "pdserve:kv_transfer_bytes": ("pdserve.kv_transfer_bytes", "By"),
    "pdserve:kv_transfer_seconds": ("pdserve.kv_transfer", "s"),
    "pdserve:num_requests_waiting": ("pdserve.num_requests_waiting", ""),
    "pdserve:num_requests_running": ("pdserve.num_requests_running", ""),
    "pdserve:kv_cache_usage_perc": ("pdserve.kv_cache_usage_perc", "1"),
    "pdserve:prefix_cache_hits": ("pdserve.prefix_cache_hits", ""),
    "pdserve:num_preemptions": ("pdserve.num_preemptions", ""),
}


def fake_loop() -> SimpleNamespace:
    """What the scheduler collector reads of an engine loop."""
    sched = SimpleNamespace(waiting=[1], running=[1, 2], blocks=SimpleNamespace(num_free=30, num_total=40),
                            prefix_hit_tokens=32, preemptions=0)
    return SimpleNamespace(scheduler=sched, lock=threading.Lock())


def small_registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    h = Histogram("t:lat_seconds", "Latency.", registry=reg, buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 0.7, 3.0):
        h.observe(v)
    c = Counter("t:errors", "Errors.", ["code"], registry=reg)
    c.labels(code="UNAVAILABLE").inc(2)
    c.labels(code="CANCELLED").inc()
    Gauge("t:usage_perc", "Usage.", registry=reg).set(0.25)
    return reg


def test_conversion_is_exact():
    before = time.time_ns()
    data = to_metrics_data(small_registry().collect(), service_resource("svc"), start_ns=7, now_ns=123)
    (rm,) = data.resource_metrics
    assert rm.resource.attributes["service.name"] == "svc"
    (sm,) = rm.scope_metrics
    assert sm.scope.name == "pdserve"
    by = {m.name: m for m in sm.metrics}
    assert sorted(by) == ["t.errors", "t.lat", "t.usage_perc"]

    lat = by["t.lat"]
    assert (lat.unit, lat.description) == ("s", "Latency.")
    assert lat.data.aggregation_temporality.name == "CUMULATIVE"
    (p,) = lat.data.data_points
    assert (p.count, p.sum, p.attributes) == (4, pytest.approx(4.25), {})
    assert list(p.explicit_bounds) == [0.1, 1.0] and list(p.bucket_counts) == [1, 2, 1]
    assert p.time_unix_nano == 123 and p.start_time_unix_nano >= before  # from the series' _created

    err = by["t.errors"]
    assert err.data.is_monotonic and err.data.aggregation_temporality.name == "CUMULATIVE"
    assert {p.attributes["code"]: p.value for p in err.data.data_points} == {"UNAVAILABLE": 2.0, "CANCELLED": 1.0}

    usage = by["t.usage_perc"]
    assert usage.unit == "1" and [(p.value, p.attributes) for p in usage.data.data_points] == [(0.25, {})]


def test_every_pdserve_metric_has_a_distinct_otlp_name():
    gateway = metrics.GatewayMetrics()
    gateway.errors.labels(code="UNAVAILABLE").inc()
    worker = metrics.WorkerMetrics(fake_loop())
    families = [*gateway.registry.collect(), *worker.registry.collect()]
    assert {f.name: otlp_name(f.name) for f in families} == NAMES
    assert len({n for n, _ in NAMES.values()}) == len(NAMES)
    # Counters without a _created sample (read from the scheduler) start at the exporter's start.
    data = to_metrics_data(worker.registry.collect(), service_resource("w"), start_ns=7, now_ns=9)
    hits = find(data.resource_metrics[0].scope_metrics[0].metrics, "pdserve.prefix_cache_hits")
    (p,) = hits.data.data_points
    assert (p.value, p.start_time_unix_nano) == (32.0, 7)


@pytest.mark.parametrize("flag, env, want", [
    (None, {}, None),
    ("http://c:4317", {}, ("http://c:4317", 60.0)),
    (None, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4317", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317"},
     ("http://m:4317", 60.0)),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317", "OTEL_METRIC_EXPORT_INTERVAL": "250"},
     ("http://a:4317", 0.25)),
    (None, {"OTEL_METRICS_EXPORTER": "otlp"}, (None, 60.0)),
    (None, {"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317"}, None),
    ("http://c:4317", {"OTEL_METRICS_EXPORTER": "none"}, ("http://c:4317", 60.0)),
    ("http://c:4317", {"OTEL_SDK_DISABLED": "true"}, None),
    (None, {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4317"}, None),
])
def test_settings_from_flag_and_env(flag, env, want):
    got = metrics.otlp_metrics_config(flag, env)
    assert (got if got is None else (got.endpoint, got.interval_s)) == want


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "inf"])
def test_bad_interval_names_the_variable(bad):
    env = {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": bad}
    with pytest.raises(ValueError, match="OTEL_METRIC_EXPORT_INTERVAL"):
        metrics.otlp_metrics_config(None, env)


def test_a_service_with_a_bad_interval_exits_naming_it(monkeypatch):
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "soon")
    with pytest.raises(SystemExit, match="pdserve-decode: OTEL_METRIC_EXPORT_INTERVAL .* got 'soon'"):
        metrics.export_otlp("http://127.0.0.1:1", CollectorRegistry(), "pdserve-decode")


OFF_SCRIPT = """
import json, sys
from pdserve import metrics
r = metrics.export_otlp(None, metrics.GatewayMetrics().registry, "pdserve-gateway")
print(json.dumps({"exporter": r is not None,
                  "loaded": sorted(m for m in sys.modules if m == "pdserve.otlp_metrics"
                                   or m.startswith(("opentelemetry.sdk.metrics", "opentelemetry.exporter")))}))
"""


def test_off_by_default_imports_nothing():
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", OFF_SCRIPT], env=clean, capture_output=True, text=True,
                         timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"exporter": False, "loaded": []}


def exporter_to(receiver: MetricsReceiver, registry: CollectorRegistry, interval_s: float) -> PeriodicExporter:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    return PeriodicExporter(registry, OTLPMetricExporter(endpoint=receiver.endpoint), service_resource("svc"),
                            interval_s).start()


def test_shutdown_sends_the_final_snapshot():
    with MetricsReceiver() as rx:
        reg = small_registry()
        exp = exporter_to(rx, reg, interval_s=3600)  # no periodic export during the test
        Counter("t:late", "After start.", registry=reg).inc(5)
        exp.shutdown()
        (export,) = rx.metrics("svc")
    lat = find(export, "t.lat").histogram
    assert lat.aggregation_temporality == 2  # CUMULATIVE
    (p,) = lat.data_points
    assert (p.count, p.sum, list(p.bucket_counts), list(p.explicit_bounds)) == (4, 4.25, [1, 2, 1], [0.1, 1.0])
    assert not p.HasField("min") and not p.HasField("max")
    errors = find(export, "t.errors").sum
    assert errors.is_monotonic
    got = {p.attributes[0].value.string_value: p.as_double for p in errors.data_points}
    assert got == {"UNAVAILABLE": 2.0, "CANCELLED": 1.0}
    assert find(export, "t.late").sum.data_points[0].as_double == 5.0
    assert find(export, "t.usage_perc").gauge.data_points[0].as_double == 0.25


def test_periodic_exports_are_cumulative_snapshots():
    with MetricsReceiver() as rx:
        reg = CollectorRegistry()
        c = Counter("t:n", "N.", registry=reg)
        exp = exporter_to(rx, reg, interval_s=0.05)
        try:
            c.inc()
            assert rx.wait_for(lambda: any(find(m, "t.n").sum.data_points[0].as_double == 1.0
                                           for m in rx.metrics("svc")), timeout=10)
            c.inc(2)
            assert rx.wait_for(lambda: find(rx.metrics("svc")[-1], "t.n").sum.data_points[0].as_double == 3.0,
                               timeout=10)
        finally:
            exp.shutdown()
        values = [find(m, "t.n").sum.data_points[0].as_double for m in rx.metrics("svc")]
    assert len(values) >= 3 and values == sorted(values) and values[-1] == 3.0
