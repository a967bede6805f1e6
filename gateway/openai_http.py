"""OpenAI-compatible HTTP face of the gateway (aiohttp, in the gateway's event loop).

`/v1/models`, `/v1/completions`, `/v1/chat/completions`, streamed (SSE) or not. Requests take
the same `Generation` path as gRPC; errors are OpenAI-style JSON: 400 (naming the param), 401
(--api-key: gateway.auth), 404 (unknown model), 429 (backpressure, with Retry-After), 503 (no
worker, shutting down). CORS with --allowed-origins (gateway.cors).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import prometheus_client
from aiohttp import web
from opentelemetry import propagate

from gateway import openai_schema as schema
from gateway import chat_answer, responses_api, tokenize_api, tools
from gateway import cors as cross_origin
from gateway import reasoning as think
from gateway.auth import ApiKeys, http_middleware
from gateway.deadline import Deadline
from gateway.errors import GatewayError, invalid
from gateway.generation import UNKNOWN_MODEL, Generation
from gateway.observe import observed
from pdserve.core.sampling import ValidationError
from pdserve.metrics import GatewayMetrics
from pdserve.proto import gateway_pb2

log = logging.getLogger(__name__)

STATUS = {grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
          grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
          grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
          grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout")}


def error_body(e: GatewayError) -> tuple[int, dict]:
    """HTTP status and OpenAI error object for e."""
    status, kind = STATUS.get(e.code, (500, "internal_error"))
    param = schema.openai_param(e.field)
    code = e.code.name.lower()
    tail = _after_field(e)
    message = param + tail if param and tail is not None else e.message  # in the OpenAI parameter's name
    if param == "model" and status == 400 and message.startswith(f"model: {UNKNOWN_MODEL}"):
        status, code = 404, "model_not_found"
    return status, {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _after_field(e: GatewayError) -> str | None:
    """e's message after the field name it starts with (None where it does not start so)."""
    return e.message[len(e.field):] if e.field and e.message.startswith(e.field + ":") else None


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

    def __init__(self, generation: Generation, metrics: GatewayMetrics | None = None,
                 tool_parser: str | None = None, reasoning_parser: str | None = None,
                 api_keys: ApiKeys | None = None, cors: cross_origin.Cors | None = None) -> None:
        self.generation = generation
        self.tool_parser = tool_parser  # reads the calls of tool_choice "auto" (gateway.tools.PARSERS)
        self.reasoning_parser = reasoning_parser  # splits off a chat answer's thinking (gateway.reasoning)
        self.metrics = metrics
        self.words = schema.TokenText(generation.tokenizer, generation.byte_table)  # for logprobs
        self.runner: web.AppRunner | None = None
        guards = ([cross_origin.preflight_middleware(cors)] if cors else []) + (  # preflights carry no key
            [http_middleware(api_keys)] if api_keys else [])
        self.app = web.Application(client_max_size=16 << 20, middlewares=[*guards, json_errors])
        if cors is not None:
            cross_origin.add_response_headers(self.app, cors)
        self.app.add_routes([web.get("/v1/models", self.models), web.get("/v1/models/{name:.+}", self.model),
                             web.get("/health", self.health), web.get("/ping", self.health), web.post("/ping", self.health),
                             web.get("/version", self.version), web.get("/metrics", self.prometheus),
                             web.post("/v1/completions", self.completions),
                             web.post("/v1/chat/completions", self.chat), web.post("/v1/responses", self.responses),
                             web.post("/tokenize", self.tokenize), web.post("/detokenize", self.detokenize)])

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

    def _model_card(self) -> dict:
        m = self.generation.model
        return {"id": m.name, "object": "model", "created": int(time.time()), "owned_by": "pdserve",
                "max_model_len": m.max_model_len}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        """OpenAI's GET /v1/models/{model}: this gateway's model, or 404 naming it."""
        try:
            self.generation.check_model(request.match_info["name"])
        except ValidationError as e:
            return error_response(invalid(e))
        return web.json_response(self._model_card())

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": importlib.metadata.version("pdserve")})

    async def prometheus(self, request: web.Request) -> web.Response:
        """The gateway's Prometheus metrics on the API port too (as vLLM's server has them), the
        same as on --metrics-port."""
        if self.metrics is None:
            return web.Response(status=404, text="this gateway keeps no metrics\n")
        return web.Response(body=prometheus_client.generate_latest(self.metrics.registry),
                            headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: a prompt's (or chat's) token ids, their count and max_model_len."""
        try:
            return web.json_response(tokenize_api.tokenize(await _json_body(request), self.generation, self.words))
        except GatewayError as e:
            return error_response(e)

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's /detokenize: token ids back to text."""
        try:
            return web.json_response(tokenize_api.detokenize(await _json_body(request), self.generation))
        except GatewayError as e:
            return error_response(e)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """Parse, start every choice's generation, answer with SSE or one JSON object (or an error)."""
        async with contextlib.AsyncExitStack() as closing:  # a gone client aborts every generation at once
            body: dict = {}
            try:
                body = await _json_body(request)
                prompts = [schema.chat_request(body, self.tool_parser)] if chat else schema.completion_requests(body)
                tool_choice = schema.tool_choice(body, prompts[0], self.tool_parser) if chat else None
                reasoning = self._reasoning(prompts[0], schema.include_reasoning(body)) if chat else None
                echoed = schema.echo(body, chat)
                reqs = schema.samples(body, prompts)
                limit = self.generation.admission.max_queued
                if limit is not None and len(reqs) > limit:  # they could never all be admitted: not a 429
                    raise schema.bad("n" if len(reqs) > len(prompts) else "prompt",
                                     f"{len(reqs)} choices exceed this gateway's --max-queued-requests ({limit})")
                stream = _stream_flag(body)
                opts = body.get("stream_options") or {}
                if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
                    raise schema.bad("stream_options", "must be an object like {\"include_usage\": true}")
                if opts.get("continuous_usage_stats") not in (None, False):  # vLLM's: usage on every chunk
                    raise schema.bad("stream_options.continuous_usage_stats", "is not supported by this server")
                include_usage = opts.get("include_usage", False)
                rid = uuid.uuid4().hex
                streams = [await self._start(closing, request, r, uuid.uuid4().hex if i else rid, fill_max_tokens=chat)
                           for i, r in enumerate(reqs)]
                firsts = await _firsts(streams, n=len(reqs) // len(prompts), batch=len(prompts) > 1)
                width = schema.asked_prompt_logprobs(body)
                prompt_logprobs = None if width is None else [
                    schema.vllm_prompt_logprobs(f.chunk, width, self.words) for f in firsts]
            except GatewayError as e:
                return error_response(schema.as_sent(e, body))  # structured output: the parameter sent
            reply = Reply(("chatcmpl-" if chat else "cmpl-") + rid, self.generation.model.name, chat,
                          per_prompt=len(reqs) // len(prompts), logprobs=self._logprobs(chat, reqs),
                          echo=[self._prompt_text(r) for r in reqs] if echoed else None,
                          prompt_logprobs=prompt_logprobs,
                          tool_choice=tool_choice, reasoning=reasoning)
            if stream:
                return await reply.stream(request, firsts, streams, include_usage)
            return await reply.whole(firsts, streams)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's Responses API over the chat path (gateway.responses_api); nothing is stored."""
        async with contextlib.AsyncExitStack() as closing:  # a gone client aborts the generation
            body: dict = {}
            chat: dict = {}
            names = responses_api.Names()
            try:
                body = await _json_body(request)
                chat, names = responses_api.to_chat(body)
                req = schema.chat_request(chat, self.tool_parser)
                choice = schema.tool_choice(chat, req, self.tool_parser)
                reasoning = self._reasoning(req, schema.include_reasoning(chat))
                stream = _stream_flag(body)
                rid = uuid.uuid4().hex
                gen = await self._start(closing, request, req, rid, fill_max_tokens=True)
                first = (await _firsts([gen], n=1, batch=False))[0]
            except GatewayError as e:
                return error_response(names.renamed(schema.as_sent(e, chat)))
            builder = responses_api.Builder(responses_api.frame(rid, self.generation.model.name, body, chat))
            deltas = chat_answer.ChatDeltas(reasoning, choice)
            if not stream:
                try:
                    return web.json_response(await responses_api.answer(builder, deltas, _aiter(_merged([first], [gen])), None))
                except GatewayError as e:
                    return error_response(e)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)

            async def write(event: dict) -> None:
                await resp.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
            try:
                await responses_api.answer(builder, deltas, _aiter(_merged([first], [gen])), write)
            except GatewayError as e:
                await write({"type": "error", "sequence_number": builder.seq, "code": e.code.name.lower(),
                             "message": e.message, "param": schema.openai_param(e.field)})
            await resp.write_eof()
            return resp

    async def _start(self, closing: contextlib.AsyncExitStack, request: web.Request, req: gateway_pb2.GenerateRequest,
                     rid: str, fill_max_tokens: bool) -> AsyncIterator[gateway_pb2.GenerateResponse]:
        """One generation's stream (observed: the span joins the caller's trace), closed, and so
        aborted, when `closing` closes."""
        return await closing.enter_async_context(contextlib.aclosing(observed(
            self.generation.stream(req, rid, Deadline(None), fill_max_tokens=fill_max_tokens),
            req, self.generation.model.name, propagate.extract(request.headers), self.metrics)))

    def _reasoning(self, req: gateway_pb2.GenerateRequest, include: bool) -> think.Reasoning | None:
        """How a chat answer's thinking is split off (None: no --reasoning-parser): the prompt is
        rendered here for its end, which says whether the answer starts inside it. A structured
        output then holds from the end of the reasoning (StructuredOutput.reasoning)."""
        if self.reasoning_parser is None:
            return None
        try:
            tail = self.generation.chat_text(req.chat)[-64:]
        except ValidationError as e:
            raise invalid(e) from None
        reasoning = think.for_request(self.reasoning_parser, tail, include)
        if req.sampling.HasField("structured_output"):
            req.sampling.structured_output.reasoning = reasoning.guided
        return reasoning

    def _prompt_text(self, req: gateway_pb2.GenerateRequest) -> str:
        """A completion prompt's text, for echo (token ids decoded)."""
        if req.WhichOneof("input") == "text":
            return req.text
        return self.generation.tokenizer.decode(list(req.token_ids.ids))

    def _logprobs(self, chat: bool, reqs: list[gateway_pb2.GenerateRequest]) -> list[schema.ChoiceLogprobs | None]:
        """Each choice's logprobs builder, None where the request did not ask for logprobs."""
        eos = self.generation.model.eos_ids
        return [schema.ChoiceLogprobs(chat, r, self.words, eos) if r.sampling.HasField("logprobs") else None
                for r in reqs]


async def _firsts(streams: list[AsyncIterator[gateway_pb2.GenerateResponse]], n: int, batch: bool
                  ) -> list[gateway_pb2.GenerateResponse]:
    """Every stream's first message, awaited together: where one fails (validation,
    backpressure, no worker) its error is the answer, naming the prompt of a batch."""
    results = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
    for i, r in enumerate(results):
        if isinstance(r, GatewayError):
            if batch and schema.openai_param(r.field) == "prompt":
                field, tail = f"prompt[{i // n}]", _after_field(r)
                raise GatewayError(r.code, field + (tail if tail is not None else f": {r.message}"),
                                   r.retry_after_ms, field) from None
            raise r
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def _stream_flag(body: dict) -> bool:
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise schema.bad("stream", "must be a boolean")
    return stream


async def _json_body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise schema.bad("body", "not valid JSON") from None
    if not isinstance(body, dict):
        raise schema.bad("body", "must be a JSON object")
    return body


class Reply:
    """Turns the GenerateResponse streams of a request's choices (prompt by prompt, `per_prompt`
    each) into OpenAI JSON: one object, or SSE chunks that carry each choice's index. `logprobs`: each
    choice's builder, or None (`"logprobs": null`); a streamed chunk carries the logprobs of the tokens
    of the gateway chunk it comes from (sent even when their text is held back). With echo, the
    prompt's text (and its tokens' logprobs, when asked) come first: in a streamed answer, in one
    event before the generated ones. `prompt_logprobs`: each choice's vLLM `prompt_logprobs`, on
    each choice (completions) or, once, on the response (chat, as vLLM); never streamed.
    `tool_choice` and `reasoning` (chat): each choice's tool calls and reasoning are read out of its
    text (gateway.chat_answer)."""

    def __init__(self, oid: str, model: str, chat: bool, logprobs: list[schema.ChoiceLogprobs | None],
                 per_prompt: int = 1, echo: list[str] | None = None,
                 prompt_logprobs: list[list[dict | None]] | None = None,
                 tool_choice: tools.ToolChoice | None = None, reasoning: think.Reasoning | None = None) -> None:
        self.tool_choice, self.reasoning = tool_choice, reasoning
        self.oid, self.model, self.chat, self.per_prompt = oid, model, chat, per_prompt
        self.logprobs = logprobs
        self.echo = echo  # each choice's prompt text, which its text starts with (completions' echo)
        self.prompt_logprobs = prompt_logprobs
        self.kind = "chat.completion" if chat else "text_completion"

    def _opening(self, i: int, first: gateway_pb2.GenerateResponse) -> dict | None:
        """Choice i's logprobs object before its generated tokens: under echo, its prompt's entries
        (from its first message), else empty; None where it has no logprobs."""
        lp = self.logprobs[i]
        if lp is None:
            return None
        return lp.prompt_part(first.chunk, self.echo[i]) if self.echo else lp.empty()

    def usage(self, done: list[gateway_pb2.Complete]) -> dict:
        """Each prompt's tokens once, every choice's completion tokens."""
        prompt = sum(d.usage.prompt_tokens for d in done[::self.per_prompt])
        completion = sum(d.usage.completion_tokens for d in done)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _part(self, i: int, chunk: gateway_pb2.Chunk) -> dict | None:
        """Choice i's logprobs object for chunk's tokens, or None where it has none."""
        lp = self.logprobs[i]
        return lp.part(chunk) if lp is not None else None

    async def whole(self, firsts: list[gateway_pb2.GenerateResponse],
                    rests: list[AsyncIterator[gateway_pb2.GenerateResponse]]) -> web.Response:
        texts: list[list[str]] = [[self.echo[i]] if self.echo else [] for i in range(len(firsts))]
        done: dict[int, gateway_pb2.Complete] = {}
        try:
            logprobs = [self._opening(i, first) for i, first in enumerate(firsts)]
            async with contextlib.aclosing(_merged(firsts, rests)) as merged:
                async for i, msg in merged:
                    if msg.HasField("chunk"):
                        texts[i].append(msg.chunk.text)
                        part = self._part(i, msg.chunk)
                        if part is not None:
                            schema.merge_logprobs(logprobs[i], part)
                    else:
                        done[i] = msg.complete
        except GatewayError as e:
            return error_response(e)
        obj = schema.envelope(self.kind, self.oid, self.model, [
            schema.choice(self.chat, "".join(texts[i]), schema.FINISH_NAMES.get(done[i].finish_reason), delta=False,
                          index=i, logprobs=logprobs[i], tool_choice=self.tool_choice, reasoning=self.reasoning)
            for i in range(len(firsts))])
        if self.prompt_logprobs is not None and self.chat:  # one prompt: vLLM puts them on the response
            obj["prompt_logprobs"] = self.prompt_logprobs[0]
        elif self.prompt_logprobs is not None:
            for c, plp in zip(obj["choices"], self.prompt_logprobs):
                c["prompt_logprobs"] = plp
        obj["usage"] = self.usage([done[i] for i in range(len(firsts))])
        return web.json_response(obj, headers={"x-request-id": done[0].request_id})

    async def stream(self, request: web.Request, firsts: list[gateway_pb2.GenerateResponse],
                     rests: list[AsyncIterator[gateway_pb2.GenerateResponse]], include_usage: bool
                     ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        kind = self.kind + ".chunk" if self.chat else self.kind
        chunk = lambda i, text, finish, first=False, logprobs=None: schema.envelope(  # noqa: E731
            kind, self.oid, self.model,
            [schema.choice(self.chat, text, finish, delta=True, first=first, index=i, logprobs=logprobs)])
        if self.chat:
            for i in range(len(firsts)):
                await resp.write(sse(chunk(i, "", None, first=True)))
        done: dict[int, gateway_pb2.Complete] = {}
        shapers = [chat_answer.ChatDeltas(self.reasoning, self.tool_choice) for _ in firsts] if self.chat else None
        deltas = lambda i, ds, finish=None, logprobs=None: [  # noqa: E731  (logprobs ride the first)
            schema.envelope(kind, self.oid, self.model, [schema.delta_choice(d, finish if k == len(ds) - 1 else None, i,
                                                                             logprobs if k == 0 else None)])
            for k, d in enumerate(ds)]
        try:
            for i, text in enumerate(self.echo or ()):
                await resp.write(sse(chunk(i, text, None, logprobs=self._opening(i, firsts[i]))))
            async with contextlib.aclosing(_merged(firsts, rests)) as merged:
                async for i, msg in merged:
                    if msg.HasField("chunk"):
                        part = self._part(i, msg.chunk)
                        if shapers is not None:
                            ds = shapers[i].feed(msg.chunk.text)
                            if not ds and part is not None and any(part.values()):
                                ds = [{}]
                            for event in deltas(i, ds, logprobs=part):
                                await resp.write(sse(event))
                        elif msg.chunk.text or (part is not None and any(part.values())):  # text or entries
                            await resp.write(sse(chunk(i, msg.chunk.text, None, logprobs=part)))
                        continue
                    done[i] = msg.complete
                    finish = schema.FINISH_NAMES.get(msg.complete.finish_reason)
                    if shapers is not None:
                        ds, finish = shapers[i].close(finish)
                        for event in deltas(i, [*ds, {}], finish):
                            await resp.write(sse(event))
                    else:
                        await resp.write(sse(chunk(i, "", finish)))
            if include_usage:
                await resp.write(sse({**schema.envelope(kind, self.oid, self.model, []),
                                      "usage": self.usage([done[i] for i in range(len(firsts))])}))
        except GatewayError as e:
            await resp.write(sse(error_body(e)[1]))
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp


async def _merged(firsts: list[gateway_pb2.GenerateResponse], rests: list[AsyncIterator[gateway_pb2.GenerateResponse]]
                  ) -> AsyncIterator[tuple[int, gateway_pb2.GenerateResponse]]:
    """(choice index, message) of every choice as they come, until each has sent its Complete;
    the first choice that fails raises its GatewayError, and closing this cancels the rest."""
    queue: asyncio.Queue = asyncio.Queue()
    pumps = [asyncio.create_task(_pump(i, f, r, queue)) for i, (f, r) in enumerate(zip(firsts, rests))]
    try:
        left = len(pumps)
        while left:
            i, msg = await queue.get()
            if isinstance(msg, GatewayError):
                raise msg
            left -= msg.HasField("complete")
            yield i, msg
    finally:
        for p in pumps:
            p.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _pump(i: int, first: gateway_pb2.GenerateResponse, rest: AsyncIterator[gateway_pb2.GenerateResponse],
                queue: asyncio.Queue) -> None:
    """Choice i's messages into the queue, as (i, message); a GatewayError goes in as the message."""
    try:
        async for msg in _chain(first, rest):
            await queue.put((i, msg))
            if msg.HasField("complete"):
                return
        raise GatewayError(grpc.StatusCode.INTERNAL, "a generation ended without its final message")
    except GatewayError as e:
        await queue.put((i, e))
    except Exception as e:  # never leave the response waiting for a choice that cannot come
        log.exception("choice %d of a streamed response failed", i)
        await queue.put((i, GatewayError(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}")))


async def _chain(first: gateway_pb2.GenerateResponse,
                 rest: AsyncIterator[gateway_pb2.GenerateResponse]) -> AsyncIterator[gateway_pb2.GenerateResponse]:
    yield first
    async for item in rest:
        yield item


async def _aiter(merged: AsyncIterator[tuple[int, gateway_pb2.GenerateResponse]]
                 ) -> AsyncIterator[gateway_pb2.GenerateResponse]:
    """The messages of one choice's merged stream."""
    async with contextlib.aclosing(merged):
        async for _, msg in merged:
            yield msg
