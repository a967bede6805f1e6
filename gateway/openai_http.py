"""OpenAI-compatible HTTP face of the gateway (aiohttp, in the gateway's event loop).

`/v1/models`, `/v1/completions`, `/v1/chat/completions`, streamed (SSE) or not. Requests take
the same `Generation` path as gRPC; errors are OpenAI-style JSON: 400 (naming the param), 404
(unknown model), 429 (backpressure, with Retry-After), 503 (no worker, shutting down).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator

import grpc
from aiohttp import web
from opentelemetry import propagate

from gateway import openai_schema as schema
from gateway.deadline import Deadline
from gateway.errors import GatewayError
from gateway.generation import UNKNOWN_MODEL, Generation
from gateway.observe import observed
from pdserve.metrics import GatewayMetrics
from pdserve.proto import gateway_pb2

STATUS = {grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
          grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
          grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
          grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout")}


def error_body(e: GatewayError) -> tuple[int, dict]:
    """HTTP status and OpenAI error object for e."""
    status, kind = STATUS.get(e.code, (500, "internal_error"))
    param = schema.openai_param(e.field)
    code = e.code.name.lower()
    message = e.message
    if e.field and param and message.startswith(e.field + ":"):
        message = param + message[len(e.field):]  # say it in the OpenAI parameter's name
    if param == "model" and status == 400 and message.startswith(f"model: {UNKNOWN_MODEL}"):
        status, code = 404, "model_not_found"
    return status, {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(e: GatewayError) -> web.Response:
    status, body = error_body(e)
    headers = {}
    if e.retry_after_ms is not None:
        headers = {"Retry-After": str(max(1, math.ceil(e.retry_after_ms / 1000))),
                   "retry-after-ms": str(e.retry_after_ms)}
    return web.json_response(body, status=status, headers=headers)


def sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    """aiohttp's own 404/405/413 answers as OpenAI error objects (SDKs parse `error.message`)."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = f"{request.method} {request.path}: {e.reason}"
        return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                            "code": e.reason.lower().replace(" ", "_")}},
                                 status=e.status, headers={k: v for k, v in e.headers.items() if k == "Allow"})


class OpenAIServer:
    """The aiohttp application and its listener; `start` binds, `stop` closes."""

    def __init__(self, generation: Generation, metrics: GatewayMetrics | None = None) -> None:
        self.generation = generation
        self.metrics = metrics
        self.runner: web.AppRunner | None = None
        self.app = web.Application(client_max_size=16 << 20, middlewares=[json_errors])
        self.app.add_routes([web.get("/v1/models", self.models), web.get("/health", self.health),
                             web.post("/v1/completions", self.completions),
                             web.post("/v1/chat/completions", self.chat)])

    async def start(self, host: str, port: int, reuse_port: bool = False) -> None:
        """Listen on host:port; reuse_port shares the port with other gateway processes."""
        self.runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port, reuse_port=reuse_port or None).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.generation.admission.draining else 200)

    async def models(self, request: web.Request) -> web.Response:
        m = self.generation.model
        return web.json_response({"object": "list", "data": [{
            "id": m.name, "object": "model", "created": int(time.time()), "owned_by": "pdserve",
            "max_model_len": m.max_model_len}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """Parse, start the generation, answer with SSE or one JSON object (or an error)."""
        try:
            body = await _json_body(request)
            req = (schema.chat_request if chat else schema.completion_request)(body)
            stream = body.get("stream") or False
            if not isinstance(stream, bool):
                raise schema.bad("stream", "must be a boolean")
            opts = body.get("stream_options") or {}
            if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
                raise schema.bad("stream_options", "must be an object like {\"include_usage\": true}")
            include_usage = opts.get("include_usage", False)
            rid = uuid.uuid4().hex
            responses = observed(self.generation.stream(req, rid, Deadline(None), fill_max_tokens=chat), req,
                                 self.generation.model.name, propagate.extract(request.headers), self.metrics)
            first = await anext(responses)  # fails here: validation, backpressure, no worker
        except GatewayError as e:
            return error_response(e)
        reply = Reply(("chatcmpl-" if chat else "cmpl-") + rid, self.generation.model.name, chat)
        async with contextlib.aclosing(responses):  # a gone client aborts the request at once
            if stream:
                return await reply.stream(request, first, responses, include_usage)
            return await reply.whole(first, responses)


async def _json_body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise schema.bad("body", "not valid JSON") from None
    if not isinstance(body, dict):
        raise schema.bad("body", "must be a JSON object")
    return body


class Reply:
    """Turns one request's GenerateResponse stream into OpenAI JSON (whole or SSE chunks)."""

    def __init__(self, oid: str, model: str, chat: bool) -> None:
        self.oid, self.model, self.chat = oid, model, chat
        self.kind = "chat.completion" if chat else "text_completion"

    async def whole(self, first: gateway_pb2.GenerateResponse,
                    rest: AsyncIterator[gateway_pb2.GenerateResponse]) -> web.Response:
        text: list[str] = []
        try:
            async for resp in _chain(first, rest):
                if resp.HasField("chunk"):
                    text.append(resp.chunk.text)
                else:
                    done = resp.complete
        except GatewayError as e:
            return error_response(e)
        obj = schema.envelope(self.kind, self.oid, self.model, [schema.choice(
            self.chat, "".join(text), schema.FINISH_NAMES.get(done.finish_reason), delta=False)])
        obj["usage"] = schema.usage(done)
        return web.json_response(obj, headers={"x-request-id": done.request_id})

    async def stream(self, request: web.Request, first: gateway_pb2.GenerateResponse,
                     rest: AsyncIterator[gateway_pb2.GenerateResponse], include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        kind = self.kind + ".chunk" if self.chat else self.kind
        chunk = lambda text, finish, first=False: schema.envelope(  # noqa: E731
            kind, self.oid, self.model, [schema.choice(self.chat, text, finish, delta=True, first=first)])
        if self.chat:
            await resp.write(sse(chunk("", None, first=True)))
        try:
            async for msg in _chain(first, rest):
                if msg.HasField("chunk"):
                    if msg.chunk.text:
                        await resp.write(sse(chunk(msg.chunk.text, None)))
                    continue
                await resp.write(sse(chunk("", schema.FINISH_NAMES.get(msg.complete.finish_reason))))
                if include_usage:
                    await resp.write(sse({**schema.envelope(kind, self.oid, self.model, []),
                                          "usage": schema.usage(msg.complete)}))
        except GatewayError as e:
            await resp.write(sse(error_body(e)[1]))
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp


async def _chain(first: gateway_pb2.GenerateResponse,
                 rest: AsyncIterator[gateway_pb2.GenerateResponse]) -> AsyncIterator[gateway_pb2.GenerateResponse]:
    yield first
    async for item in rest:
        yield item
