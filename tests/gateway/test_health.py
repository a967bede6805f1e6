"""gateway.health.Monitor against a real grpc.health.v1 service on loopback: a worker leaves the
router when its check fails and comes back when it passes, and the logs say which happened."""

from __future__ import annotations

import asyncio
import logging
import socket

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.health import Monitor
from gateway.router import NoWorker, Router
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
    assert lines == [("INFO", "is ready"), ("WARNING", "is out (health check says NOT_SERVING)"), ("WARNING", "is back")]


def test_never_ready_is_logged_once_and_named_in_the_error(caplog: pytest.LogCaptureFixture) -> None:
    """A worker that never answers: one WARNING naming it and the failure (not one per check, not
    silence), and a request's NoWorker error names the role, the address and the same failure."""
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"

    async def main() -> str:
        router = Router([address], ["127.0.0.1:1"])
        monitor = Monitor(router, timeout_s=0.2, warn_after_s=0.0)
        try:
            for _ in range(3):
                await monitor.check_all()
            with pytest.raises(NoWorker) as e:
                await router.choose(lambda: router.pick_prefill([1, 2, 3]))
            return str(e.value)
        finally:
            await router.close()

    with caplog.at_level(logging.INFO, logger="gateway.health"):
        error = asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if r.name == "gateway.health" and r.levelname == "WARNING"]
    mine = [w for w in warnings if address in w]
    assert len(mine) == 1 and "is not ready" in mine[0] and "health check failed: DEADLINE_EXCEEDED" in mine[0]
    assert error.startswith("no healthy prefill worker available (")
    assert f"{address}: health check failed: DEADLINE_EXCEEDED" in error
