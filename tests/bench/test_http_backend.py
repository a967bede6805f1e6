"""The openai-http backend against a tiny OpenAI-style SSE server (chunked transfer encoding)."""

from __future__ import annotations

import asyncio
import json

import pytest

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.http_backend import OpenAIHttpBackend


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, auth: list[str] | None = None) -> None:
    """GET /v1/models, or a streamed completion of max_tokens one-token chunks 10 ms apart;
    each request's Authorization header ("" when none) is appended to auth."""
    request_line = (await reader.readline()).decode()
    length, seen = 0, ""
    while (line := (await reader.readline()).decode().strip()):
        if line.lower().startswith("content-length"):
            length = int(line.split(":")[1])
        if line.lower().startswith("authorization:"):
            seen = line.split(":", 1)[1].strip()
    if auth is not None:
        auth.append(seen)
    body = json.loads(await reader.readexactly(length)) if length else {}
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
    if request_line.startswith("GET"):
        writer.write(_chunk(json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode()))
    else:
        assert body["stream"] and body["ignore_eos"] and isinstance(body["prompt"], list)
        for i in range(body["max_tokens"]):
            await asyncio.sleep(0.01)
            writer.write(_chunk(f"data: {json.dumps({'choices': [{'text': f't{i}'}]})}\n\n".encode()))
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}
        writer.write(_chunk(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode()))
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()


def test_streams_and_times_a_completion() -> None:
    async def go() -> tuple[int | None, list]:
        server = await asyncio.start_server(_handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        backend = OpenAIHttpBackend(f"127.0.0.1:{port}")
        try:
            return await backend.max_model_len(), await asyncio.gather(
                *(backend.send(BenchRequest((1, 2, 3), 5)) for _ in range(3)))
        finally:
            server.close()

    max_len, outs = asyncio.run(go())
    assert max_len == 4096
    for o in outs:
        assert o.success, o.error
        assert (o.prompt_len, o.output_len, len(o.itl)) == (3, 5, 4)
        assert o.ttft > 0.005 and all(g > 0.005 for g in o.itl)
        assert o.latency >= o.ttft + sum(o.itl) - 1e-6
        assert o.tpot == pytest.approx((o.latency - o.ttft) / 4)


def test_refused_connection_is_a_failed_request() -> None:
    from pdserve.launch import free_port

    out = asyncio.run(OpenAIHttpBackend(f"127.0.0.1:{free_port()}").send(BenchRequest((1,), 2)))
    assert not out.success and "ConnectionRefused" in out.error


def test_sends_the_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """--api-key (else $PDSERVE_API_KEY) goes out as `Authorization: Bearer <key>`; none, none."""
    async def go(backend_key: str | None) -> list[str]:
        auth: list[str] = []
        server = await asyncio.start_server(lambda r, w: _handle(r, w, auth), "127.0.0.1", 0)
        backend = OpenAIHttpBackend(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", api_key=backend_key)
        try:
            await backend.max_model_len()
            assert (await backend.send(BenchRequest((1, 2), 2))).success
        finally:
            server.close()
        return auth

    assert asyncio.run(go("k1")) == ["Bearer k1", "Bearer k1"]
    assert asyncio.run(go(None)) == ["", ""]
    monkeypatch.setenv("PDSERVE_API_KEY", "k2")
    assert asyncio.run(go(None)) == ["Bearer k2", "Bearer k2"]
