"""The one error type of the gateway's shared path; each front end (gRPC, HTTP) renders it."""

from __future__ import annotations

import grpc


class GatewayError(Exception):
    """A request failed with a gRPC status code; `field` names the bad parameter, if one."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_ms: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms
        self.field = field

    def __str__(self) -> str:
        return self.message


def bad(param: str, message: str) -> GatewayError:
    """INVALID_ARGUMENT naming param: "param: message"."""
    return GatewayError(grpc.StatusCode.INVALID_ARGUMENT, f"{param}: {message}", field=param)


def invalid(e: ValueError) -> GatewayError:
    """A ValidationError (its `field` and "field: message") as INVALID_ARGUMENT."""
    return GatewayError(grpc.StatusCode.INVALID_ARGUMENT, str(e), field=getattr(e, "field", None))
