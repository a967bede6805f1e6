"""API keys on the gateway's two faces (vLLM's `--api-key`).

With keys set, every HTTP request needs `Authorization: Bearer <key>` except the probes in
OPEN_PATHS (and CORS preflights, which browsers send without credentials): 401 with an OpenAI
error object otherwise. Unknown paths are refused too: a route added later is guarded from the
start. On gRPC, every pdserve.v1.Gateway RPC needs `authorization: Bearer <key>` metadata
(UNAUTHENTICATED otherwise); grpc.health.v1 and reflection stay open for probes and tools.
Keys are compared as SHA-256 digests with hmac.compare_digest (constant time, any length), every
key every time; messages never repeat what was sent.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence

import grpc
from aiohttp import web

from pdserve.api_keys import SCHEME

OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics"})  # load balancers, scrapers


class ApiKeys:
    """The keys a gateway accepts (none: every caller is accepted)."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = tuple(_digest(k) for k in keys)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def problem(self, authorization: str | None, where: str) -> tuple[str, str] | None:
        """None where `authorization` (the value `where` names, e.g. "the `authorization`
        metadata") carries one of the keys; else (code, message): missing_api_key or invalid_api_key."""
        if not self._digests:
            return None
        if not authorization:
            return "missing_api_key", f"missing API key: send it in {where} as `{SCHEME} <key>`"
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != SCHEME.lower() or not token.strip():
            return "invalid_api_key", f"{where} must be `{SCHEME} <key>`"
        sent = _digest(token.strip())
        matched = False
        for d in self._digests:  # no early exit: the time does not say which key matched
            matched |= hmac.compare_digest(sent, d)
        return None if matched else ("invalid_api_key", f"wrong API key in {where}")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def http_middleware(keys: ApiKeys):
    """aiohttp middleware: 401 with an OpenAI error object (and `WWW-Authenticate: Bearer`) for a
    request without one of keys, unless it is a preflight or its route is in OPEN_PATHS."""

    @web.middleware
    async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS" or _route(request) in OPEN_PATHS:
            return await handler(request)
        problem = keys.problem(request.headers.get("Authorization"), "the `Authorization` header")
        if problem is None:
            return await handler(request)
        code, message = problem
        return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                            "code": code}}, status=401, headers={"WWW-Authenticate": SCHEME})

    return require_key


def _route(request: web.Request) -> str | None:
    """The path template of the route request matched (None: no route; 404 or 405), so that a
    path spelled oddly cannot reach a guarded handler through an open name."""
    resource = request.match_info.route.resource
    return None if resource is None else resource.canonical


class GrpcKeyCheck(grpc.aio.ServerInterceptor):
    """Refuses calls to `services` without one of keys in their `authorization` metadata, with
    UNAUTHENTICATED, before their request is parsed; other services pass untouched."""

    def __init__(self, keys: ApiKeys, services: Sequence[str]) -> None:
        self.keys = keys
        self.prefixes = tuple(f"/{s}/" for s in services)

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self.prefixes):
            return handler
        sent = next((v for k, v in details.invocation_metadata or () if k == "authorization"), None)
        problem = self.keys.problem(sent if isinstance(sent, str) else None, "the `authorization` metadata")
        return handler if problem is None else _refusal(handler, problem[1])


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of handler's kind that answers UNAUTHENTICATED (the request stays unparsed)."""

    async def refuse(request, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
