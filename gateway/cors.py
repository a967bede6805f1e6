"""CORS on the OpenAI face, with vLLM's flags (--allowed-origins, --allowed-methods,
--allowed-headers, --allow-credentials) and the answers of Starlette's CORSMiddleware, which vLLM
uses. Unlike vLLM, off unless --allowed-origins is given (vLLM allows every origin by default):
a browser page on another site cannot read the API unless the operator says which sites may.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from gateway.auth import Handler

ANY = "*"
ALL_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
SAFELISTED_HEADERS = frozenset({"accept", "accept-language", "content-language", "content-type"})
MAX_AGE_S = 600


def json_list(text: str) -> list[str]:
    """argparse type: a JSON list of strings (argparse names the flag in its error)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings, e.g. '[\"https://a.example\"]', "
                                         f"got {text!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings, got {text!r}")
    return value


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allowed-origins", type=json_list, default=None, metavar="JSON",
                   help="CORS on the HTTP face: origins whose browser pages may call it, e.g. "
                        "'[\"https://app.example\"]' or '[\"*\"]' (off when absent, unlike vLLM)")
    p.add_argument("--allowed-methods", type=json_list, default=[ANY], metavar="JSON",
                   help="CORS: methods a preflight may ask for (default [\"*\"])")
    p.add_argument("--allowed-headers", type=json_list, default=[ANY], metavar="JSON",
                   help="CORS: request headers a preflight may ask for (default [\"*\"])")
    p.add_argument("--allow-credentials", action="store_true",
                   help="CORS: let browsers send cookies and HTTP auth (needs explicit --allowed-origins)")


@dataclass(frozen=True)
class Cors:
    """Which cross-origin browser requests the HTTP face answers, and the headers it answers with."""

    origins: tuple[str, ...]
    methods: tuple[str, ...] = (ANY,)
    headers: tuple[str, ...] = (ANY,)
    credentials: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Cors | None:
        """The flags' policy (None: no --allowed-origins, no CORS); ValueError names a bad flag."""
        if args.allowed_origins is None:
            return None
        for origin in args.allowed_origins:
            _check_origin(origin)
        if args.allow_credentials and ANY in args.allowed_origins:
            raise ValueError("--allow-credentials: needs the origins listed in --allowed-origins, not \"*\"")
        return cls(tuple(args.allowed_origins), tuple(m.upper() for m in args.allowed_methods),
                   tuple(h.lower() for h in args.allowed_headers), args.allow_credentials)

    def allows(self, origin: str) -> bool:
        return ANY in self.origins or origin in self.origins

    def response_headers(self, origin: str) -> dict[str, str]:
        """The CORS headers of a response to a request from origin (none where it is not allowed)."""
        if not self.allows(origin):
            return {}
        if ANY in self.origins:  # never with credentials (from_args)
            return {"Access-Control-Allow-Origin": ANY}
        out = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if self.credentials:
            out["Access-Control-Allow-Credentials"] = "true"
        return out

    def preflight(self, origin: str, method: str, headers: str | None) -> tuple[list[str], dict[str, str]]:
        """(what is refused, naming its flag; the response headers) of a preflight from origin
        asking for method and the comma-separated request headers."""
        out = {"Access-Control-Allow-Methods": ", ".join(ALL_METHODS if ANY in self.methods else self.methods),
               "Access-Control-Max-Age": str(MAX_AGE_S), **self.response_headers(origin)}
        refused = [] if self.allows(origin) else [f"origin {origin!r} (--allowed-origins)"]
        if ANY not in self.methods and method.upper() not in self.methods:
            refused.append(f"method {method!r} (--allowed-methods)")
        asked = [h.strip().lower() for h in (headers or "").split(",") if h.strip()]
        if ANY in self.headers:
            if asked:
                out["Access-Control-Allow-Headers"] = ", ".join(asked)
        else:
            allowed = SAFELISTED_HEADERS | set(self.headers)
            out["Access-Control-Allow-Headers"] = ", ".join(sorted(allowed))
            refused += [f"header {h!r} (--allowed-headers)" for h in asked if h not in allowed]
        return refused, out


def _check_origin(origin: str) -> None:
    """ValueError unless origin is "*" or scheme://host[:port], the form browsers send."""
    if origin == ANY:
        return
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query or parts.fragment:
        raise ValueError(f"--allowed-origins: {origin!r} is not an origin like \"https://app.example:8443\" "
                         "(scheme://host[:port], no path)")


def preflight_middleware(cors: Cors):
    """aiohttp middleware answering CORS preflights (OPTIONS with Origin and
    Access-Control-Request-Method): 200, or 400 naming what is refused. Put it before any key
    check: browsers send preflights without credentials."""

    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        method = request.headers.get("Access-Control-Request-Method")
        if request.method != "OPTIONS" or origin is None or method is None:
            return await handler(request)
        refused, headers = cors.preflight(origin, method, request.headers.get("Access-Control-Request-Headers"))
        if not refused:
            return web.Response(status=200, text="OK", headers=headers)
        return web.json_response({"error": {"message": "CORS preflight refused: " + ", ".join(refused),
                                            "type": "invalid_request_error", "param": None, "code": "cors_refused"}},
                                 status=400, headers=headers)

    return preflight


def add_response_headers(app: web.Application, cors: Cors) -> None:
    """The CORS headers on every response of app to a request with an Origin (errors and streamed
    answers included: they are set just before the headers go out)."""

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is None or "Access-Control-Allow-Origin" in response.headers:  # a preflight has its own
            return
        for name, value in cors.response_headers(origin).items():
            if name == "Vary" and response.headers.get("Vary"):
                value = f"{response.headers['Vary']}, {value}"
            response.headers[name] = value

    app.on_response_prepare.append(add)
