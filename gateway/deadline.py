"""A request's deadline, carried hop by hop: every worker call gets what is left of it."""

from __future__ import annotations

import time

import grpc

from gateway.errors import GatewayError


class Deadline:
    """An absolute deadline on the monotonic clock (None: the caller set none)."""

    def __init__(self, timeout: float | None) -> None:
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self, cap: float | None = None) -> float | None:
        """Seconds left, at most cap; raises DEADLINE_EXCEEDED when none are left."""
        if self.at is None:
            return cap
        left = self.at - time.monotonic()
        if left <= 0:
            raise GatewayError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded in the gateway")
        return left if cap is None else min(left, cap)
