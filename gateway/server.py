"""The public gRPC service: validates, tokenizes, runs the flow, detokenizes, applies stops."""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from gateway import flow
from gateway.detokenizer import IncrementalDetokenizer
from gateway.observe import observed
from gateway.router import NoWorker, Router
from gateway.stops import StopChecker
from gateway.tokenizer import encode_prompt
from gateway.wire_check import bad_field
from pdserve.core.request import Sequence, check_finish
from pdserve.core.sampling import SamplingParams, ValidationError, validate_prompt
from pdserve.metrics import GatewayMetrics
from pdserve.proto import gateway_pb2
from pdserve.serving import sampling_to_wire

log = logging.getLogger(__name__)

FINISH = {"stop": gateway_pb2.FINISH_REASON_STOP, "length": gateway_pb2.FINISH_REASON_LENGTH,
          "abort": gateway_pb2.FINISH_REASON_ABORT}
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED,
             grpc.StatusCode.CANCELLED, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}


@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int
    vocab_size: int
    eos_ids: tuple[int, ...]


class BadRequest:
    """Stands in for a request whose bytes did not parse; carries the field to blame."""

    def __init__(self, data: bytes) -> None:
        self.reason = bad_field(data)


def parse_request(data: bytes) -> gateway_pb2.GenerateRequest | BadRequest:
    try:
        return gateway_pb2.GenerateRequest.FromString(data)
    except DecodeError:
        return BadRequest(data)


def sampling_from_request(s: gateway_pb2.SamplingParams) -> SamplingParams:
    opt = lambda name, default: getattr(s, name) if s.HasField(name) else default  # noqa: E731
    return SamplingParams(
        temperature=opt("temperature", 1.0), top_p=opt("top_p", 1.0), top_k=opt("top_k", -1),
        seed=opt("seed", None), max_tokens=opt("max_tokens", 16), min_tokens=opt("min_tokens", 0),
        stop=tuple(s.stop), stop_token_ids=tuple(s.stop_token_ids), ignore_eos=opt("ignore_eos", False),
    )


class GatewayService:
    def __init__(self, model: ModelInfo, tokenizer, router: Router, metrics: GatewayMetrics | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.router = router
        self.metrics = metrics

    def prepare(self, req: gateway_pb2.GenerateRequest) -> tuple[list[int], SamplingParams]:
        """Prompt ids and sampling params, or ValidationError naming the field."""
        if req.model and req.model != self.model.name:
            raise ValidationError("model", f"unknown model {req.model!r}; this gateway serves {self.model.name!r}")
        params = sampling_from_request(req.sampling)
        params.validate()
        kind = req.WhichOneof("input")
        try:
            if kind == "text":
                ids = encode_prompt(self.tokenizer, text=req.text)
            elif kind == "chat":
                ids = encode_prompt(self.tokenizer, messages=[(m.role, m.content) for m in req.chat.messages])
            elif kind == "token_ids":
                ids = encode_prompt(self.tokenizer, token_ids=list(req.token_ids.ids))
            else:
                raise ValidationError("input", "set one of text, chat or token_ids")
            validate_prompt(ids, params.max_tokens, self.model.vocab_size, self.model.max_model_len)
        except ValidationError as e:
            raise ValidationError(_public_field(kind, e.field), str(e).split(": ", 1)[-1]) from None
        if any(t >= self.model.vocab_size for t in params.stop_token_ids):
            raise ValidationError("sampling.stop_token_ids", "token id outside the vocabulary")
        return ids, params

    async def Generate(self, request, context: grpc.aio.ServicerContext):
        """The token stream of one request, inside its `gateway.generate` span and metrics."""
        inner = self._generate(request, context)
        async with contextlib.aclosing(observed(inner, request, self.model.name, context, self.metrics)) as stream:
            async for resp in stream:
                yield resp

    async def _generate(self, request, context: grpc.aio.ServicerContext):
        if isinstance(request, BadRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        try:
            prompt, params = self.prepare(request)
        except ValidationError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        rid = uuid.uuid4().hex
        await context.send_initial_metadata((("x-request-id", rid),))
        job = flow.Job(rid, prompt, sampling_to_wire(params), self._first_finishes(prompt, params))
        detok = IncrementalDetokenizer(self.tokenizer, prompt)
        stops = StopChecker(params.stop)
        generated, finish, matched = 0, "abort", None
        try:
            async with contextlib.aclosing(flow.run(job, self.router, context.time_remaining())) as tokens:
                async for ids, why in tokens:
                    generated += len(ids)
                    text_ids = ids[:-1] if why == "stop" else ids  # no text for EOS / stop tokens
                    text, matched = stops.feed(detok.add(text_ids))
                    if matched is None and why is not None:  # the end: release held-back text
                        tail, matched = stops.feed(detok.flush())
                        text += tail if matched else tail + stops.flush()
                    yield gateway_pb2.GenerateResponse(chunk=gateway_pb2.Chunk(token_ids=ids, text=text))
                    if matched is not None:
                        finish = "stop"
                        break
                    if why is not None:
                        finish = why
                        break
        except grpc.aio.AioRpcError as e:
            code = e.code() if e.code() in RETRYABLE else grpc.StatusCode.UNAVAILABLE
            await context.abort(code, f"worker error: {e.details()}")
        except NoWorker as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        complete = gateway_pb2.Complete(
            finish_reason=FINISH[finish], request_id=rid,
            usage=gateway_pb2.Usage(prompt_tokens=len(prompt), completion_tokens=generated))
        if matched is not None:
            complete.stop_string = matched
        yield gateway_pb2.GenerateResponse(complete=complete)

    def _first_finishes(self, prompt: list[int], params: SamplingParams):
        def check(token: int) -> str | None:
            seq = Sequence("", prompt, params, self.model.eos_ids, output_ids=[token])
            why = check_finish(seq, self.model.max_model_len)
            return None if why is None else why.value

        return check

    async def ListModels(self, request, context) -> gateway_pb2.ListModelsResponse:
        info = gateway_pb2.ModelInfo(id=self.model.name, max_model_len=self.model.max_model_len)
        return gateway_pb2.ListModelsResponse(models=[info])


def _public_field(kind: str | None, field: str) -> str:
    if field.startswith("messages"):
        return "chat." + field
    if field == "prompt_token_ids":
        return "token_ids.ids"
    if field == "prompt":
        return {"text": "text", "chat": "chat.messages", "token_ids": "token_ids.ids"}.get(kind or "", "input")
    return field


def add_to_server(service: GatewayService, server: grpc.aio.Server) -> None:
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            service.Generate, request_deserializer=parse_request,
            response_serializer=gateway_pb2.GenerateResponse.SerializeToString),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            service.ListModels, request_deserializer=gateway_pb2.ListModelsRequest.FromString,
            response_serializer=gateway_pb2.ListModelsResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("pdserve.v1.Gateway", handlers),))
