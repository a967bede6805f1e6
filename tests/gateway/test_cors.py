"""CORS on the OpenAI face (--allowed-origins & co., Starlette's answers as vLLM gives them), off
by default; in process with the key check behind it."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.__main__ import access, parser
from gateway.auth import ApiKeys, http_middleware
from gateway.cors import ALL_METHODS, Cors, add_response_headers, preflight_middleware

APP = "https://app.example"


def cors(*flags: str) -> Cors | None:
    return access(parser().parse_args(["--port", "0", *flags]))[1]


def test_off_unless_origins_are_given():
    assert cors() is None
    assert cors("--allowed-origins", '["*"]') == Cors(("*",))
    assert cors("--allowed-origins", f'["{APP}"]', "--allowed-methods", '["get", "post"]', "--allowed-headers",
                '["Authorization"]', "--allow-credentials") == Cors((APP,), ("GET", "POST"), ("authorization",), True)


@pytest.mark.parametrize("flags, message", [
    (["--allowed-origins", '["*"]', "--allow-credentials"], "--allow-credentials: needs the origins listed"),
    (["--allowed-origins", '["https://app.example/"]'], "--allowed-origins: 'https://app.example/' is not an origin"),
    (["--allowed-origins", '["app.example"]'], "--allowed-origins: 'app.example' is not an origin"),
])
def test_bad_policies_stop_the_gateway_naming_the_flag(flags, message):
    with pytest.raises(SystemExit, match=message):
        cors(*flags)


@pytest.mark.parametrize("text", ["https://app.example", '{"a": 1}', "[1]"])
def test_the_flags_take_json_lists_of_strings(text, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--port", "0", "--allowed-origins", text])
    assert "--allowed-origins: must be a JSON list of strings" in capsys.readouterr().err


def test_response_headers():
    assert Cors(("*",)).response_headers("https://x.example") == {"Access-Control-Allow-Origin": "*"}
    listed = Cors((APP,), credentials=True)
    assert listed.response_headers(APP) == {"Access-Control-Allow-Origin": APP, "Vary": "Origin",
                                            "Access-Control-Allow-Credentials": "true"}
    assert listed.response_headers("https://evil.example") == {}


def test_preflights():
    refused, headers = Cors(("*",)).preflight(APP, "POST", "Authorization, Content-Type")
    assert refused == [] and headers == {"Access-Control-Allow-Methods": ", ".join(ALL_METHODS),
                                         "Access-Control-Max-Age": "600", "Access-Control-Allow-Origin": "*",
                                         "Access-Control-Allow-Headers": "authorization, content-type"}
    strict = Cors((APP,), ("GET", "POST"), ("authorization",))
    refused, headers = strict.preflight(APP, "POST", "authorization, content-type")
    assert refused == [] and headers["Access-Control-Allow-Origin"] == APP
    assert headers["Access-Control-Allow-Headers"] == "accept, accept-language, authorization, content-language, content-type"
    refused, headers = strict.preflight("https://evil.example", "DELETE", "x-secret")
    assert refused == ["origin 'https://evil.example' (--allowed-origins)", "method 'DELETE' (--allowed-methods)",
                       "header 'x-secret' (--allowed-headers)"]
    assert "Access-Control-Allow-Origin" not in headers


def test_in_the_app_before_the_key_check():
    """A preflight is answered without a key; every answer to a request with an allowed Origin
    carries the CORS headers: a 401, a JSON body and a streamed one alike; none without Origin."""

    async def whole(request: web.Request) -> web.Response:
        return web.json_response({"ok": True}, headers={"Vary": "Accept-Encoding"})

    async def streamed(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def main() -> list:
        policy = Cors((APP,), ("POST",))
        app = web.Application(middlewares=[preflight_middleware(policy), http_middleware(ApiKeys(["k"]))])
        add_response_headers(app, policy)
        app.add_routes([web.post("/v1/chat/completions", whole), web.post("/v1/completions", streamed)])
        key, origin = {"Authorization": "Bearer k"}, {"Origin": APP}
        out = []
        async with TestClient(TestServer(app)) as c:
            for method, path, headers in [
                ("OPTIONS", "/v1/chat/completions", {**origin, "Access-Control-Request-Method": "POST",
                                                     "Access-Control-Request-Headers": "authorization"}),
                ("OPTIONS", "/v1/chat/completions", {"Origin": "https://evil.example",
                                                     "Access-Control-Request-Method": "POST"}),
                ("POST", "/v1/chat/completions", origin),
                ("POST", "/v1/chat/completions", {**origin, **key}),
                ("POST", "/v1/completions", {**origin, **key}),
                ("POST", "/v1/completions", key),
            ]:
                r = await c.request(method, path, headers=headers)
                await r.read()
                out.append((r.status, r.headers.get("Access-Control-Allow-Origin"), r.headers.get("Vary")))
        return out

    assert asyncio.run(main()) == [(200, APP, "Origin"), (400, None, None), (401, APP, "Origin"),
                                   (200, APP, "Accept-Encoding, Origin"), (200, APP, "Origin"), (200, None, None)]
