"""The health probe used by compose, and the metric names on the Prometheus endpoint."""

from __future__ import annotations

import asyncio
import urllib.request
from types import SimpleNamespace

from pdserve import healthcheck, metrics
from pdserve.launch import free_port

GATEWAY_NAMES = ["pdserve:time_to_first_token_seconds", "pdserve:time_per_output_token_seconds",
                 "pdserve:inter_token_latency_seconds", "pdserve:e2e_request_latency_seconds"]
WORKER_NAMES = ["pdserve:num_requests_waiting", "pdserve:num_requests_running", "pdserve:kv_cache_usage_perc",
                "pdserve:kv_transfer_bytes_total", "pdserve:kv_transfer_seconds", "pdserve:prefix_cache_hits_total",
                "pdserve:num_preemptions_total"]


class FakeLoop:
    """Just what the scheduler collector reads."""

    def __init__(self) -> None:
        import threading

        blocks = SimpleNamespace(num_free=75, num_total=100)
        self.scheduler = SimpleNamespace(waiting=[1, 2], running=[1, 2, 3], blocks=blocks,
                                         prefix_hit_tokens=32, preemptions=1)
        self.lock = threading.Lock()


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def test_gateway_metric_names_on_the_endpoint():
    m = metrics.GatewayMetrics()
    port = free_port()
    assert metrics.serve(port, m.registry, "127.0.0.1")
    m.ttft.observe(0.05)
    m.errors.labels(code="UNAVAILABLE").inc()
    text = scrape(port)
    for name in GATEWAY_NAMES:
        assert f"# TYPE {name} histogram" in text
    assert "pdserve:time_to_first_token_seconds_count 1.0" in text
    assert 'pdserve:request_errors_total{code="UNAVAILABLE"} 1.0' in text


def test_worker_metric_names_and_values():
    port = free_port()
    m = metrics.serve_worker(port, FakeLoop(), extra_waiting=lambda: 4, host="127.0.0.1")
    m.transfer(4096, 0.002)
    text = scrape(port)
    for name in WORKER_NAMES:
        assert name in text
    assert "pdserve:num_requests_waiting 6.0" in text and "pdserve:num_requests_running 3.0" in text
    assert "pdserve:kv_cache_usage_perc 0.25" in text and "pdserve:kv_transfer_bytes_total 4096.0" in text
    assert "pdserve:prefix_cache_hits_total 32.0" in text and "pdserve:num_preemptions_total 1.0" in text


def test_metrics_off_without_a_port():
    assert not metrics.serve(0, metrics.GatewayMetrics().registry)


def test_healthcheck_exit_codes():
    from pdserve import serving

    async def run() -> tuple[int, int]:
        server = serving.new_server()
        health = serving.add_health(server, ["x"])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await serving.set_serving(health, ["x"], True)
        up = await asyncio.to_thread(healthcheck.main, [f"127.0.0.1:{port}"])
        await serving.set_serving(health, ["x"], False)
        down = await asyncio.to_thread(healthcheck.main, [f"127.0.0.1:{port}", "x"])
        await server.stop(0)
        return up, down

    assert asyncio.run(run()) == (0, 1)
    assert healthcheck.main([f"127.0.0.1:{free_port()}"]) == 1
    assert healthcheck.main([]) == 2
