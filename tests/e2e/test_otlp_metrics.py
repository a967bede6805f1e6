"""Three real processes pushing their metrics over OTLP/gRPC to a receiver inside the test.

The export interval is longer than the test, so what arrives is each service's final snapshot,
sent while it drains after SIGTERM: that proves the exporter was started from the service's
flags and flushed on shutdown. The periodic loop itself is tested in tests/deploy/test_otlp_metrics.py.
"""

from __future__ import annotations

import pytest

from pdserve.launch import Stack
from pdtest.otlp import MetricsReceiver, find
from pdtest.stack import assert_no_leaks

pytestmark = pytest.mark.slow

N = 3
MAX_TOKENS = 4
OTEL_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_METRICS_EXPORTER",
             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED",
             "PDSERVE_TRACE_FILE")


def test_each_service_sends_its_metrics_on_sigterm(default_model_dir, monkeypatch):
    for var in OTEL_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # no periodic export during the test
    with MetricsReceiver() as rx:
        flag = ["--otlp-metrics-endpoint", rx.endpoint]
        with Stack(model=str(default_model_dir), worker_args=["--max-model-len", "512", *flag],
                   gateway_args=["--max-model-len", "512", *flag]) as st:
            from pdserve.client import Client

            with Client(st.gateway) as c:
                for i in range(N):
                    c.generate(text=f"Request {i}: the capital of France is", max_tokens=MAX_TOKENS,
                               temperature=0.0, ignore_eos=True, timeout=60)
            assert_no_leaks(st)
            assert rx.requests == []
        # Exactly one export per service: its final snapshot.
        (gateway,) = rx.metrics("pdserve-gateway")
        (prefill,) = rx.metrics("pdserve-prefill")
        (decode,) = rx.metrics("pdserve-decode")

    ttft = find(gateway, "pdserve.time_to_first_token")
    assert ttft.unit == "s" and ttft.histogram.aggregation_temporality == 2  # CUMULATIVE
    p = ttft.histogram.data_points[0]
    assert p.count == N and sum(p.bucket_counts) == N and p.sum > 0 and len(p.explicit_bounds) == 19
    assert find(gateway, "pdserve.e2e_request_latency").histogram.data_points[0].count == N
    itl = find(gateway, "pdserve.inter_token_latency").histogram.data_points[0]
    assert itl.count == N * (MAX_TOKENS - 1)  # tokens after the first
    kv = find(prefill, "pdserve.kv_transfer").histogram.data_points[0]
    assert kv.count == N and find(prefill, "pdserve.kv_transfer_bytes").sum.data_points[0].as_double > 0
    usage = find(decode, "pdserve.kv_cache_usage_perc")
    assert usage.unit == "1" and usage.gauge.data_points[0].as_double == 0.0  # every block freed
    assert find(decode, "pdserve.num_requests_running").gauge.data_points[0].as_double == 0.0
