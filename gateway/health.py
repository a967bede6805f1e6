"""Background health checks (grpc.health.v1) and load polling (GetStats) of every worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from grpc_health.v1 import health_pb2

from gateway.router import Router, Worker
from pdserve.proto import worker_pb2

log = logging.getLogger(__name__)


class Monitor:
    """Polls every worker each `period_s`: unhealthy ones leave the router, recovered ones come back.
    A worker whose first check has not passed `warn_after_s` after the monitor began is logged once
    as a WARNING with the latest failure (a worker that never comes up is not silent)."""

    def __init__(self, router: Router, period_s: float = 0.5, timeout_s: float = 1.0,
                 warn_after_s: float = 30.0) -> None:
        self.router = router
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.warn_after_s = warn_after_s
        self._began = time.monotonic()
        self._warned: set[str] = set()  # addresses already reported as not ready
        self._task: asyncio.Task | None = None
        router.recheck = self.check_all
        for w in router.workers:  # unknown until a check passes: a request before it rechecks
            w.healthy = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def check_all(self) -> None:
        """Check every worker now (also used when a request finds no healthy worker)."""
        await asyncio.gather(*(self._check(w) for w in self.router.workers))

    async def _run(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.period_s)

    async def _check(self, worker: Worker) -> None:
        first = worker.stats is None  # no check has passed yet (a passing one sets the stats)
        try:
            # wait_for_ready: a channel still in reconnect backoff (a worker that came up after the
            # gateway's first check) connects within the timeout instead of failing at once
            resp = await worker.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=self.timeout_s,
                                             wait_for_ready=True)
            ok = resp.status == health_pb2.HealthCheckResponse.SERVING
            if ok:
                worker.stats = await worker.stub.GetStats(worker_pb2.StatsRequest(), timeout=self.timeout_s)
            else:
                worker.last_error = f"health check says {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}"
        except grpc.aio.AioRpcError as e:
            ok = False
            worker.last_error = f"health check failed: {e.code().name} {e.details()}"
        waited = time.monotonic() - self._began
        if ok and first:
            log.info("worker %s is ready", worker.address)
        elif first and waited >= self.warn_after_s and worker.address not in self._warned:
            self._warned.add(worker.address)
            log.warning("worker %s is not ready %.0f s after the gateway started (%s)", worker.address,
                        waited, worker.last_error)
        elif ok != worker.healthy:
            log.warning("worker %s is %s", worker.address, "back" if ok else f"out ({worker.last_error})")
        worker.healthy = ok
