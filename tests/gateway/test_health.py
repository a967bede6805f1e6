"""gateway.health.Monitor against a real grpc.health.v1 service on loopback: a worker leaves the
router when its check fails and comes back when it passes, and the logs say which happened."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.health import Monitor
from gateway.router import Router
from pdserve.proto import worker_pb2, worker_pb2_grpc


class Stats(worker_pb2_grpc.DecodeWorkerServicer):
    async def GetStats(self, request, context):
        return worker_pb2.WorkerStats(running=3)


def test_ready_then_out_then_back(caplog: pytest.LogCaptureFixture) -> None:
    """First pass: INFO "ready" (not a WARNING at every start); a failing check: WARNING "out"
    and the worker leaves the router; passing again: WARNING "back"."""

    async def main() -> None:
        server = grpc.aio.server()
        status = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(status, server)
        worker_pb2_grpc.add_DecodeWorkerServicer_to_server(Stats(), server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        router = Router([], [], colocated=[address])
        monitor = Monitor(router, timeout_s=2.0)
        (worker,) = router.workers
        try:
            assert not worker.healthy  # unknown until a check passes
            seen = []
            for serving in (True, True, False, True):
                await status.set("", health_pb2.HealthCheckResponse.SERVING if serving
                                 else health_pb2.HealthCheckResponse.NOT_SERVING)
                await monitor.check_all()
                seen.append(worker.healthy)
            assert seen == [True, True, False, True]
            assert worker.stats is not None and worker.stats.running == 3
        finally:
            await worker.channel.close()
            await server.stop(None)

    with caplog.at_level(logging.INFO, logger="gateway.health"):
        asyncio.run(main())
    lines = [(r.levelname, r.getMessage().split(" ", 2)[2]) for r in caplog.records if r.name == "gateway.health"]
    assert lines == [("INFO", "is ready"), ("WARNING", "is out (health check failed)"), ("WARNING", "is back")]
