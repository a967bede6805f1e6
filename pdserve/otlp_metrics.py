"""OTLP export of a service's Prometheus registry: one source of truth, pushed as OTLP MetricsData.

Imported only when OTLP metrics are on (`pdserve.metrics.export_otlp`). A daemon thread takes
a snapshot of the registry (`registry.collect()`, the same call a scrape makes) every
interval, converts it and sends it with OpenTelemetry's OTLP/gRPC exporter; `shutdown` sends
one last snapshot (the SIGTERM drain) and stops.

Conversion: a histogram becomes a cumulative OTLP histogram (count, sum, per-bucket counts,
explicit bounds; no min/max, which Prometheus does not keep), a counter a monotonic cumulative
sum, a gauge a gauge; labels become attributes. Names: `:` becomes `.`, and a `_seconds`
suffix moves into the unit (`pdserve:time_to_first_token_seconds` -> `pdserve.time_to_first_token`,
unit `s`); `_bytes` and `_perc` names keep their words and get the unit `By` / `1`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence

from opentelemetry.sdk.metrics.export import (AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
                                              Metric, MetricExporter, MetricExportResult, MetricsData,
                                              NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.metrics_core import Metric as PromMetric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from pdserve.metrics import OtlpMetricsConfig
from pdserve.telemetry import INSTRUMENTATION, service_resource

log = logging.getLogger(__name__)

# (suffix, unit, dropped from the OTLP name)
UNIT_SUFFIXES = (("_seconds", "s", True), ("_bytes", "By", False), ("_perc", "1", False))
CUMULATIVE = AggregationTemporality.CUMULATIVE

Labels = tuple[tuple[str, str], ...]


def otlp_name(prometheus_name: str) -> tuple[str, str]:
    """(OTLP name, unit) of a Prometheus family name."""
    name = prometheus_name.replace(":", ".")
    for suffix, unit, dropped in UNIT_SUFFIXES:
        if name.endswith(suffix):
            return (name[: -len(suffix)] if dropped else name), unit
    return name, ""


def _series(samples: Sequence[Sample], drop: str = "") -> dict[Labels, list[Sample]]:
    """Samples grouped by their labels (without the label drop, e.g. a histogram's `le`)."""
    out: dict[Labels, list[Sample]] = {}
    for s in samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != drop))
        out.setdefault(key, []).append(s)
    return out


def _start_ns(family: str, samples: list[Sample], default_ns: int) -> int:
    """The series' `_created` time (prometheus_client keeps one per series) or default_ns."""
    created = [s.value for s in samples if s.name == family + "_created"]
    return int(created[0] * 1e9) if created else default_ns


def _histogram(fam: PromMetric, start_ns: int, now_ns: int) -> Histogram:
    points = []
    for labels, samples in _series(fam.samples, drop="le").items():
        by = {s.name: s.value for s in samples if s.name != fam.name + "_bucket"}
        buckets = sorted((float(s.labels["le"]), s.value) for s in samples if s.name == fam.name + "_bucket")
        cumulative = [int(v) for _, v in buckets]
        counts = [c - p for c, p in zip(cumulative, [0, *cumulative[:-1]])]
        points.append(HistogramDataPoint(
            attributes=dict(labels), start_time_unix_nano=_start_ns(fam.name, samples, start_ns),
            time_unix_nano=now_ns, count=int(by[fam.name + "_count"]), sum=by[fam.name + "_sum"],
            bucket_counts=counts, explicit_bounds=[b for b, _ in buckets if not math.isinf(b)],
            min=None, max=None))  # type: ignore[arg-type]  # unknown to Prometheus; left unset in OTLP
    return Histogram(data_points=points, aggregation_temporality=CUMULATIVE)


def _numbers(fam: PromMetric, value_name: str, start_ns: int, now_ns: int) -> list[NumberDataPoint]:
    points = []
    for labels, samples in _series(fam.samples).items():
        for s in samples:
            if s.name == value_name:
                points.append(NumberDataPoint(attributes=dict(labels),
                                              start_time_unix_nano=_start_ns(fam.name, samples, start_ns),
                                              time_unix_nano=now_ns, value=float(s.value)))
    return points


def convert_family(fam: PromMetric, start_ns: int, now_ns: int) -> Metric | None:
    """One Prometheus family as an OTLP metric; None for a family without samples or of a
    type pdserve does not use (summary, info, stateset)."""
    if fam.type == "histogram":
        data: Histogram | Sum | Gauge = _histogram(fam, start_ns, now_ns)
    elif fam.type == "counter":
        data = Sum(data_points=_numbers(fam, fam.name + "_total", start_ns, now_ns),
                   aggregation_temporality=CUMULATIVE, is_monotonic=True)
    elif fam.type in ("gauge", "unknown"):
        data = Gauge(data_points=_numbers(fam, fam.name, start_ns, now_ns))
    else:
        log.debug("metric %s of type %s is not exported over OTLP", fam.name, fam.type)
        return None
    if not data.data_points:
        return None
    name, unit = otlp_name(fam.name)
    return Metric(name=name, description=fam.documentation, unit=unit, data=data)


def to_metrics_data(families: Iterable[PromMetric], resource: Resource, start_ns: int, now_ns: int) -> MetricsData:
    """A registry snapshot (`registry.collect()`) as OTLP MetricsData under the pdserve scope.

    start_ns is the start time of cumulative series without a `_created` sample.
    """
    metrics = [m for m in (convert_family(f, start_ns, now_ns) for f in families) if m is not None]
    scope = ScopeMetrics(scope=InstrumentationScope(INSTRUMENTATION), metrics=metrics, schema_url="")
    return MetricsData(resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope], schema_url="")])


class PeriodicExporter:
    """Pushes a registry's snapshot every interval from a daemon thread, and once more at shutdown."""

    def __init__(self, registry: Collector, exporter: MetricExporter, resource: Resource, interval_s: float) -> None:
        self.registry = registry
        self.exporter = exporter
        self.resource = resource
        self.interval_s = interval_s
        self.start_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-metrics", daemon=True)

    def start(self) -> PeriodicExporter:
        """Start the export thread."""
        self._thread.start()
        return self

    def export_once(self) -> bool:
        """Send one snapshot now; True when the collector accepted it."""
        data = to_metrics_data(self.registry.collect(), self.resource, self.start_ns, time.time_ns())
        return self.exporter.export(data) is MetricExportResult.SUCCESS

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._export_logged()
        self._export_logged()  # the final snapshot: everything observed up to shutdown

    def _export_logged(self) -> None:
        try:
            if not self.export_once():
                log.debug("OTLP metrics export failed")  # the OTLP exporter logged why
        except Exception:  # a bad snapshot must not kill the exporter thread
            log.exception("OTLP metrics export raised")

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export the final snapshot (waiting at most timeout_s for it) and close the exporter."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.exporter.shutdown()


def start_exporter(registry: Collector, service: str, config: OtlpMetricsConfig) -> PeriodicExporter:
    """Export registry as service (OTEL_SERVICE_NAME overrides) to config's endpoint over OTLP/gRPC."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    exporter = OTLPMetricExporter(endpoint=config.endpoint) if config.endpoint else OTLPMetricExporter()
    return PeriodicExporter(registry, exporter, service_resource(service), config.interval_s).start()
