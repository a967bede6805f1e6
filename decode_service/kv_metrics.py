"""Decode-side Prometheus counters of received KV (the prefix cache's effect on the wire)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from decode_service.engine import DecodeEngine


class ReceivedKvCollector(Collector):
    """`pdserve:kv_received_blocks_total` and `pdserve:kv_received_bytes_total`, read on scrape."""

    def __init__(self, engine: DecodeEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterable[Metric]:
        with self.engine.loop.lock:
            blocks, nbytes = self.engine.kv_received_blocks, self.engine.kv_received_bytes
        yield CounterMetricFamily("pdserve:kv_received_blocks",
                                  "KV blocks filled by completed transfers (prefix-cached blocks excluded).",
                                  value=blocks)
        yield CounterMetricFamily("pdserve:kv_received_bytes", "KV payload bytes received.", value=nbytes)
