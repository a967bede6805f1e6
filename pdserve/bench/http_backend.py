"""`--backend openai-http`: streamed `POST /v1/completions` over plain asyncio HTTP/1.1 with SSE,
timed the way vLLM's benchmark times OpenAI completions (a chunk counts when it has choices; the
token count comes from the final usage). The gateway's HTTP face is not built yet; this client
speaks the OpenAI protocol, so it also works against any OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from pdserve.api_keys import client_authorization
from pdserve.bench.datasets import BenchRequest
from pdserve.bench.metrics import RequestOutput


class HttpError(RuntimeError):
    """A non-200 answer or a malformed stream."""


async def _chunks(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[bytes]:
    """The body, as it arrives: decodes Transfer-Encoding: chunked, else reads to EOF."""
    if not chunked:
        while data := await reader.read(65536):
            yield data
        return
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readexactly(2)  # CRLF after each chunk


async def sse_events(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[str]:
    """The data of each `data:` line of a server-sent-event stream, up to `[DONE]`."""
    buf = b""
    async for data in _chunks(reader, chunked):
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode().strip()
            if text.startswith("data:"):
                payload = text[5:].strip()
                if payload == "[DONE]":
                    return
                yield payload


async def _open(host: str, port: int, path: str, body: dict[str, Any] | None,
                auth: str = "") -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
    """Sends a POST (a GET when body is None), with `auth` as its Authorization header if any;
    returns the stream after the headers and whether the body is chunked."""
    reader, writer = await asyncio.open_connection(host, port)
    raw = b"" if body is None else json.dumps(body).encode()
    auth_line = f"Authorization: {auth}\r\n" if auth else ""
    writer.write(f"{'GET' if body is None else 'POST'} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                 f"{auth_line}Accept: text/event-stream\r\nContent-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode() + raw)
    await writer.drain()
    status = (await reader.readline()).decode().split()
    headers: dict[str, str] = {}
    while (line := (await reader.readline()).decode().strip()):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    if len(status) < 2 or status[1] != "200":
        text = (await reader.read(2000)).decode(errors="replace")
        writer.close()
        raise HttpError(f"HTTP {' '.join(status[1:]) or '?'}: {text[:300]}")
    return reader, writer, headers.get("transfer-encoding") == "chunked"


class OpenAIHttpBackend:
    """Streams /v1/completions with token-id prompts, greedy sampling and ignore_eos."""

    def __init__(self, address: str, model: str = "", timeout: float | None = None,
                 api_key: str | None = None) -> None:
        hostport = address.split("://", 1)[-1].rstrip("/")
        host, _, port = hostport.rpartition(":")
        self.host, self.port, self.model, self.timeout = host or "127.0.0.1", int(port), model, timeout
        self.auth = client_authorization(api_key, os.environ)

    def _body(self, req: BenchRequest) -> dict[str, Any]:
        return {"model": self.model or None, "prompt": list(req.prompt_ids), "max_tokens": req.output_len,
                "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    async def send(self, req: BenchRequest) -> RequestOutput:
        """Times one stream; errors become a failed RequestOutput."""
        out = RequestOutput(prompt_len=req.prompt_len)
        try:
            await asyncio.wait_for(self._stream(req, out), self.timeout)
        except (OSError, HttpError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            out.error = f"{type(e).__name__}: {e}"
            out.success = False
        return out

    async def _stream(self, req: BenchRequest, out: RequestOutput) -> None:
        out.start = last = time.perf_counter()
        reader, writer, chunked = await _open(self.host, self.port, "/v1/completions", self._body(req), self.auth)
        try:
            async for payload in sse_events(reader, chunked):
                now, data = time.perf_counter(), json.loads(payload)
                if data.get("choices"):
                    if out.ttft == 0.0:
                        out.ttft = now - out.start
                    else:
                        out.itl.append(now - last)
                    last = now
                if data.get("usage"):
                    out.prompt_len = data["usage"].get("prompt_tokens") or out.prompt_len
                    out.output_len = data["usage"].get("completion_tokens", 0)
        finally:
            writer.close()
        out.latency = time.perf_counter() - out.start
        out.success = out.output_len > 0 and out.ttft > 0.0
        if not out.success:
            out.error = "stream ended without tokens or without usage"

    async def max_model_len(self) -> int | None:
        """GET /v1/models: the served model's max_model_len (vLLM's field), or None; exits clearly when
        nothing speaks OpenAI HTTP at the address."""
        try:
            reader, writer, chunked = await asyncio.wait_for(_open(self.host, self.port, "/v1/models", None, self.auth), 10)
            body = b"".join([c async for c in _chunks(reader, chunked)])
            writer.close()
            models = json.loads(body).get("data") or [{}]
        except (OSError, HttpError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            raise SystemExit(f"pdserve bench: --backend openai-http: no OpenAI HTTP server at {self.host}:{self.port} "
                             f"({type(e).__name__}: {e}); start the gateway with --http-port, or use --backend grpc "
                             "against its gRPC port") from None
        return models[0].get("max_model_len")

    async def close(self) -> None:
        return None
