"""`python -m pdserve.healthcheck HOST:PORT [SERVICE]`: exit 0 when grpc.health.v1 says SERVING.

Used by the docker compose health checks (no grpc_health_probe binary needed in the image).
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout: float = 3.0) -> bool:
    """Whether the server at address reports SERVING for service ("" = the whole server)."""
    try:
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 (serving), 1 (not serving or unreachable), 2 (usage)."""
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2:
        print("usage: python -m pdserve.healthcheck HOST:PORT [SERVICE]", file=sys.stderr)
        return 2
    return 0 if check(argv[0], argv[1] if len(argv) == 2 else "") else 1


if __name__ == "__main__":
    sys.exit(main())
