"""An OTLP/gRPC metrics receiver on 127.0.0.1 for tests: what a collector would get."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.metrics.v1 import metrics_pb2


class MetricsReceiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    """Keeps every ExportMetricsServiceRequest it receives; use as a context manager."""

    def __init__(self) -> None:
        self.requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.cond = threading.Condition()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request, context):  # noqa: N802 (the gRPC method name)
        with self.cond:
            self.requests.append(request)
            self.cond.notify_all()
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def __enter__(self) -> MetricsReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(0)

    def metrics(self, service: str) -> list[list[metrics_pb2.Metric]]:
        """The metrics of each export from service (by resource service.name), oldest first."""
        out = []
        with self.cond:
            requests = list(self.requests)
        for req in requests:
            for rm in req.resource_metrics:
                if service_name(rm) == service:
                    out.append([m for sm in rm.scope_metrics for m in sm.metrics])
        return out

    def wait_for(self, pred: Callable[[], bool], timeout: float) -> bool:
        """Wait until pred() holds (checked at each export), at most timeout seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True


def service_name(rm: metrics_pb2.ResourceMetrics) -> str:
    return next((a.value.string_value for a in rm.resource.attributes if a.key == "service.name"), "")


def find(metrics: list[metrics_pb2.Metric], name: str) -> metrics_pb2.Metric | None:
    """The metric called name in one export, or None."""
    return next((m for m in metrics if m.name == name), None)
