"""API keys (--api-key, PDSERVE_API_KEY, VLLM_API_KEY): where they come from, how a header or
metadata value is judged, and the HTTP middleware and gRPC interceptor in process (the real
gateway: tests/e2e/test_openai_http.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.__main__ import access, parser
from gateway.auth import ApiKeys, GrpcKeyCheck, http_middleware
from pdserve import api_keys
from pdserve.client import auth_metadata

HEADER = "the `Authorization` header"


@pytest.mark.parametrize("flags, env, want", [
    (None, {}, ()),
    (["a"], {"PDSERVE_API_KEY": "p", "VLLM_API_KEY": "v"}, ("a",)),  # the flag wins
    (["a", "b"], {}, ("a", "b")),  # repeated: any of them
    (None, {"PDSERVE_API_KEY": "p", "VLLM_API_KEY": "v"}, ("p",)),
    (None, {"VLLM_API_KEY": "v"}, ("v",)),  # vLLM's variable as the fallback
    (None, {"PDSERVE_API_KEY": "", "VLLM_API_KEY": ""}, ()),  # compose's ${VAR:-}: unset
    (None, {"PDSERVE_API_KEY": "", "VLLM_API_KEY": "v"}, ("v",)),
])
def test_keys_come_from_flags_else_the_environment(flags, env, want):
    assert api_keys.resolve(flags, env) == want


@pytest.mark.parametrize("flags, env, named", [
    ([""], {}, "--api-key"), (["zq9 x"], {}, "--api-key"), (["zq9é"], {}, "--api-key"),
    (None, {"PDSERVE_API_KEY": "zq9 y"}, "PDSERVE_API_KEY"), (None, {"VLLM_API_KEY": "zq9\t"}, "VLLM_API_KEY"),
])
def test_a_key_that_cannot_travel_as_bearer_is_refused_naming_its_source(flags, env, named):
    with pytest.raises(ValueError, match=f"^{named}: ") as err:
        api_keys.resolve(flags, env)
    assert "zq9" not in str(err.value)  # never repeated


def test_the_gateway_flag_is_repeatable_and_a_bad_one_stops_it(monkeypatch):
    monkeypatch.delenv("PDSERVE_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    keys, cors = access(parser().parse_args(["--port", "0", "--api-key", "k1", "--api-key", "k2"]))
    assert keys.problem("Bearer k2", HEADER) is None and cors is None
    assert not access(parser().parse_args(["--port", "0"]))[0]
    with pytest.raises(SystemExit, match="--api-key: an API key cannot be empty"):
        access(parser().parse_args(["--port", "0", "--api-key", ""]))


@pytest.mark.parametrize("sent, code, message", [
    (None, "missing_api_key", f"missing API key: send it in {HEADER} as `Bearer <key>`"),
    ("", "missing_api_key", None),
    ("Bearer wrong", "invalid_api_key", f"wrong API key in {HEADER}"),
    ("Bearer secret-1x", "invalid_api_key", None),  # a key's prefix, or longer, is no key
    ("Bearer secret-", "invalid_api_key", None),
    ("Basic secret-1", "invalid_api_key", f"{HEADER} must be `Bearer <key>`"),
    ("secret-1", "invalid_api_key", None),
    ("Bearer ", "invalid_api_key", None),
])
def test_what_is_refused(sent, code, message):
    problem = ApiKeys(["secret-1", "secret-2"]).problem(sent, HEADER)
    assert problem is not None and problem[0] == code
    assert message is None or problem[1] == message
    assert "secret" not in problem[1]


@pytest.mark.parametrize("sent", ["Bearer secret-1", "Bearer secret-2", "bearer secret-2", "  Bearer   secret-1 "])
def test_what_is_accepted(sent):
    assert ApiKeys(["secret-1", "secret-2"]).problem(sent, HEADER) is None


def test_no_keys_accept_everyone():
    assert not ApiKeys([]) and ApiKeys([]).problem(None, HEADER) is None


def test_the_client_sends_its_key_or_the_environments(monkeypatch):
    monkeypatch.delenv("PDSERVE_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert auth_metadata(None) == ()
    assert auth_metadata("k") == (("authorization", "Bearer k"),)
    monkeypatch.setenv("VLLM_API_KEY", "v")
    assert auth_metadata(None) == (("authorization", "Bearer v"),)
    monkeypatch.setenv("PDSERVE_API_KEY", "p")
    assert auth_metadata(None) == (("authorization", "Bearer p"),) and auth_metadata("k")[0][1] == "Bearer k"
    with pytest.raises(ValueError, match="^api_key: "):
        auth_metadata("a b")


def test_http_middleware_guards_every_route_but_the_probes():
    """/v1 and /tokenize need the key; the probes, a preflight's OPTIONS and no-key servers do not;
    an unknown path is refused before it is found missing (deny by default)."""

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def main() -> dict:
        app = web.Application(middlewares=[http_middleware(ApiKeys(["k"]))])
        app.add_routes([web.get(p, ok) for p in ("/health", "/ping", "/version", "/metrics", "/v1/models",
                                                 "/v1/models/{name:.+}")] + [web.post("/tokenize", ok)])
        seen = {}
        async with TestClient(TestServer(app)) as c:
            for method, path, headers in [
                ("GET", "/health", {}), ("GET", "/metrics", {}), ("GET", "/v1/models", {}),
                ("GET", "/v1/models/health", {}), ("POST", "/tokenize", {}), ("GET", "/nope", {}),
                ("GET", "/v1/models", {"Authorization": "Bearer k"}), ("GET", "/nope", {"Authorization": "Bearer k"}),
                ("OPTIONS", "/v1/models", {}),
            ]:
                r = await c.request(method, path, headers=headers)
                seen[method, path, bool(headers)] = r.status, r.headers.get("WWW-Authenticate"), (
                    await r.json() if r.status == 401 else None)
            for raw in ("/health/../v1/models", "/v1/../health", "//health", "/health%2F..%2Fv1%2Fmodels"):
                seen["raw", raw, False] = await _raw_get(c.server.port, raw), None, None
        return seen

    seen = asyncio.run(main())
    statuses = {k: v[0] for k, v in seen.items()}
    assert statuses == {("GET", "/health", False): 200, ("GET", "/metrics", False): 200,
                        ("GET", "/v1/models", False): 401, ("GET", "/v1/models/health", False): 401,
                        ("POST", "/tokenize", False): 401, ("GET", "/nope", False): 401,
                        ("GET", "/v1/models", True): 200, ("GET", "/nope", True): 404,
                        ("OPTIONS", "/v1/models", False): 405,
                        **{("raw", p, False): 401 for p in ("/health/../v1/models", "/v1/../health", "//health",
                                                            "/health%2F..%2Fv1%2Fmodels")}}
    _, challenge, body = seen["GET", "/v1/models", False]
    assert challenge == "Bearer"
    assert body == {"error": {"message": f"missing API key: send it in {HEADER} as `Bearer <key>`",
                              "type": "invalid_request_error", "param": None, "code": "missing_api_key"}}


async def _raw_get(port: int, path: str) -> int:
    """The status of a GET of path sent as it is (an HTTP client would normalize it first)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


GATEWAY = "pdserve.v1.Gateway"


def test_grpc_interceptor_guards_the_gateway_service_only():
    """Generate (unary-stream) and ListModels (unary) refuse a call without the key before the
    request is parsed or the servicer runs; grpc.health.v1 stays open."""
    ran, parsed = [], []

    async def generate(request, context):
        ran.append("Generate")
        yield b"token"

    async def list_models(request, context):
        ran.append("ListModels")
        return b"models"

    def parse(data: bytes) -> bytes:
        parsed.append(data)
        return data

    async def main() -> list:
        server = grpc.aio.server(interceptors=[GrpcKeyCheck(ApiKeys(["k"]), [GATEWAY])])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GATEWAY, {
            "Generate": grpc.unary_stream_rpc_method_handler(generate, request_deserializer=parse),
            "ListModels": grpc.unary_unary_rpc_method_handler(list_models, request_deserializer=parse)}),))
        status = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(status, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        out = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                check = health_pb2_grpc.HealthStub(ch).Check
                out.append((await check(health_pb2.HealthCheckRequest())).status)
                gen, models = ch.unary_stream(f"/{GATEWAY}/Generate"), ch.unary_unary(f"/{GATEWAY}/ListModels")
                for md in [(), (("authorization", "Bearer no"),), (("authorization", "k"),)]:
                    for call in (lambda: gen(b"req", metadata=md).read(), lambda: models(b"req", metadata=md)):
                        try:
                            await call()
                        except grpc.aio.AioRpcError as e:
                            out.append((e.code(), e.details()))
                good = (("authorization", "Bearer k"),)
                out.append([m async for m in gen(b"req", metadata=good)])
                out.append(await models(b"req", metadata=good))
        finally:
            await server.stop(None)
        return out

    out = asyncio.run(main())
    assert out[0] == health_pb2.HealthCheckResponse.SERVING
    where = "the `authorization` metadata"
    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    assert out[1:7] == [(unauthenticated, f"missing API key: send it in {where} as `Bearer <key>`")] * 2 + [
        (unauthenticated, f"wrong API key in {where}")] * 2 + [(unauthenticated, f"{where} must be `Bearer <key>`")] * 2
    assert out[7:] == [[b"token"], b"models"]
    assert ran == ["Generate", "ListModels"] and parsed == [b"req", b"req"]  # only the calls with the key


def test_the_gateway_reads_the_environment_when_no_flag_is_given(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    keys, _ = access(parser().parse_args(["--port", "0"]))
    assert keys.problem("Bearer from-vllm", HEADER) is None
    monkeypatch.setenv("PDSERVE_API_KEY", "from-pdserve")
    keys, _ = access(parser().parse_args(["--port", "0"]))
    assert keys.problem("Bearer from-pdserve", HEADER) is None and keys.problem("Bearer from-vllm", HEADER)
    monkeypatch.setenv("PDSERVE_API_KEY", "two words")
    with pytest.raises(SystemExit, match="^pdserve gateway: PDSERVE_API_KEY: an API key must be printable ASCII"):
        access(parser().parse_args(["--port", "0"]))


def test_up_passes_its_flags_to_the_gateway_and_generate_names_a_bad_key(monkeypatch):
    from pdserve.cli import _gateway_args, _up_parser, main

    args, workers = _up_parser().parse_known_args(["--api-key", "k1", "--api-key", "k2", "--allowed-origins",
                                                   '["https://a.example"]', "--http-port", "8000", "--max-num-seqs", "4"])
    gw = parser().parse_args(["--port", "0", *_gateway_args(args)])
    assert gw.api_key == ["k1", "k2"] and gw.allowed_origins == ["https://a.example"] and gw.http_port == 8000
    assert workers == ["--max-num-seqs", "4"]
    assert "--api-key" not in _gateway_args(_up_parser().parse_known_args([])[0])  # the environment's stays there
    with pytest.raises(SystemExit, match="^pdserve generate: --api-key: an API key cannot be empty"):
        main(["generate", "--api-key", "", "Hi"])
    monkeypatch.setenv("PDSERVE_API_KEY", "a b")
    with pytest.raises(SystemExit, match="^pdserve generate: PDSERVE_API_KEY: "):
        main(["generate", "Hi"])
