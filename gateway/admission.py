"""Backpressure and draining: a bounded count of requests not yet streaming their first token."""

from __future__ import annotations

import asyncio

import grpc

from gateway.errors import GatewayError


class Ticket:
    """One admitted request: queued until `started()` (its first token), gone after `close()`."""

    def __init__(self, admission: "Admission") -> None:
        self._adm = admission
        self._queued = True

    def started(self) -> None:
        """The request streams its first token: it no longer counts against the queue bound."""
        if self._queued:
            self._queued = False
            self._adm.queued -= 1

    def close(self) -> None:
        self.started()
        self._adm.active -= 1
        if self._adm.active == 0:
            self._adm.idle.set()

    def __enter__(self) -> "Ticket":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Admission:
    """Admits requests while fewer than `max_queued` wait for a first token and not draining."""

    def __init__(self, max_queued: int | None = None, retry_after_ms: int = 500) -> None:
        self.max_queued = max_queued
        self.retry_after_ms = retry_after_ms
        self.queued = 0
        self.active = 0
        self.admitted = 0  # requests admitted so far
        self.draining = False
        self.idle = asyncio.Event()
        self.idle.set()

    def enter(self) -> Ticket:
        """A ticket for a new request, or GatewayError (RESOURCE_EXHAUSTED full, UNAVAILABLE draining)."""
        if self.draining:
            raise GatewayError(grpc.StatusCode.UNAVAILABLE, "gateway is shutting down; retry on another gateway")
        if self.max_queued is not None and self.queued >= self.max_queued:
            raise GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"too many queued requests ({self.queued}, --max-queued-requests "
                               f"{self.max_queued}); retry later", retry_after_ms=self.retry_after_ms)
        self.queued += 1
        self.active += 1
        self.admitted += 1
        self.idle.clear()
        return Ticket(self)

    async def drain(self, timeout: float) -> bool:
        """Refuse new requests; wait up to timeout for in-flight ones. True when all finished."""
        self.draining = True
        try:
            await asyncio.wait_for(self.idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
