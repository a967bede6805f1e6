"""The gateway's one generation path, shared by the gRPC and HTTP faces.

Validates and tokenizes a GenerateRequest, admits it (bounded queue), runs the flow across the
workers, detokenizes incrementally and applies stop strings. Failures are GatewayError.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from gateway import flow
from gateway.admission import Admission
from gateway.deadline import Deadline
from gateway.detokenizer import ByteTable, make_detokenizer
from gateway.errors import GatewayError, invalid
from gateway.hf_tokenizer import Tokenizer
from gateway.router import NoWorker, Router
from gateway.stops import StopChecker
from gateway.tokenizer import encode_prompt, encode_rendered, render_chat, template_variables
from pdserve.core.request import Sequence, check_finish
from pdserve.core.sampling import Guide, GuideKind, SamplingParams, ValidationError, validate_prompt
from pdserve.guided import GuideCompiler
from pdserve.proto import gateway_pb2
from pdserve.serving import sampling_to_wire

FINISH = {"stop": gateway_pb2.FINISH_REASON_STOP, "length": gateway_pb2.FINISH_REASON_LENGTH,
          "abort": gateway_pb2.FINISH_REASON_ABORT}
PASSED_ON = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED,
             grpc.StatusCode.CANCELLED, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}

UNKNOWN_MODEL = "unknown model"  # the start of that error's message (the HTTP face answers it with 404)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int
    vocab_size: int
    eos_ids: tuple[int, ...]
    # (field, value) of SamplingParams for requests that leave the field unset (the model's
    # generation_config.json: gateway.sampling_defaults)
    sampling_defaults: tuple[tuple[str, Any], ...] = ()


class BadRequest:
    """Stands in for a request whose bytes did not parse; carries the field to blame."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def sampling_from_request(s: gateway_pb2.SamplingParams, defaults: Mapping[str, Any] | None = None) -> SamplingParams:
    """SamplingParams from the wire message; unset optional fields take `defaults` (the model's),
    else the built-in ones; an unset max_tokens is 16, or the model's default if that is less
    (as vLLM's completions)."""
    given = defaults or {}
    opt = lambda name, default: getattr(s, name) if s.HasField(name) else given.get(name, default)  # noqa: E731
    return SamplingParams(
        temperature=opt("temperature", 1.0), top_p=opt("top_p", 1.0), top_k=opt("top_k", -1),
        seed=opt("seed", None), max_tokens=s.max_tokens if s.HasField("max_tokens") else min(16, given.get("max_tokens", 16)),
        min_tokens=opt("min_tokens", 0),
        stop=tuple(s.stop), stop_token_ids=tuple(s.stop_token_ids), ignore_eos=opt("ignore_eos", False),
        logprobs=opt("logprobs", None), presence_penalty=opt("presence_penalty", 0.0),
        frequency_penalty=opt("frequency_penalty", 0.0), repetition_penalty=opt("repetition_penalty", 1.0),
        min_p=opt("min_p", 0.0), logit_bias=tuple(sorted(s.logit_bias.items())),
        prompt_logprobs=opt("prompt_logprobs", None), guide=_guide(s.structured_output),
    )


def _guide(so: gateway_pb2.StructuredOutput) -> Guide | None:
    """The Guide a StructuredOutput asks for (None: free text; json_object false is unset)."""
    kind = so.WhichOneof("kind")
    if kind == "json_schema":
        return Guide(GuideKind.JSON, so.json_schema, so.reasoning)
    if kind == "json_object":
        return Guide(GuideKind.JSON, '{"type": "object"}', so.reasoning) if so.json_object else None
    if kind == "regex":
        return Guide(GuideKind.REGEX, so.regex, so.reasoning)
    if kind == "choice":
        return Guide(GuideKind.CHOICE, json.dumps(list(so.choice.choices)), so.reasoning)
    if kind == "grammar":
        return Guide(GuideKind.GRAMMAR, so.grammar, so.reasoning)
    return None


class TextAssembler:
    """Token batches in, Chunk messages out: incremental text, stop strings, counts, finish."""

    def __init__(self, tokenizer: Tokenizer, prompt: list[int], params: SamplingParams,
                 table: ByteTable | None = None, text: gateway_pb2.SamplingParams | None = None) -> None:
        """`text`: the request's options for its text (skip_special_tokens, include_stop_str_in_output)."""
        skip = text is None or not text.HasField("skip_special_tokens") or text.skip_special_tokens
        self.detok = make_detokenizer(tokenizer, prompt, table, skip_special_tokens=skip)
        self.keep_stop = text is not None and text.include_stop_str_in_output
        self.prompt = prompt if params.prompt_logprobs is not None else None  # sent once, first chunk
        self.stops = StopChecker(params.stop)
        self.generated, self.finish, self.matched = 0, "abort", None

    def feed(self, ids: list[int], why: str | None, logprobs: flow.Logprobs | None = None,
             prompt_logprobs: flow.Logprobs | None = None) -> tuple[gateway_pb2.GenerateResponse, bool]:
        """The chunk message for ids (why: the worker's finish reason or None; logprobs: one
        per id, or none; prompt_logprobs: the first batch's) and whether it ends the stream."""
        self.generated += len(ids)
        text_ids = ids[:-1] if why == "stop" else ids  # no text for EOS / stop tokens
        text, self.matched = self.stops.feed(self.detok.add(text_ids))
        if self.matched is None and why is not None:  # the end: release held-back text
            tail, self.matched = self.stops.feed(self.detok.flush())
            text += tail if self.matched else tail + self.stops.flush()
        if self.matched is not None:
            self.finish = "stop"
            text += self.matched if self.keep_stop else ""
        elif why is not None:
            self.finish = why
        resp = gateway_pb2.GenerateResponse()  # filled in place: no Chunk built and then copied
        chunk = resp.chunk
        chunk.token_ids.extend(ids)
        chunk.text = text
        for lp in logprobs or ():
            _public_logprobs(lp, chunk.logprobs.add())
        if self.prompt is not None:
            if len(prompt_logprobs or ()) != len(self.prompt) - 1:
                raise GatewayError(grpc.StatusCode.INTERNAL, f"the worker sent {len(prompt_logprobs or ())} prompt "
                                   f"logprobs for a {len(self.prompt)}-token prompt")
            chunk.prompt_token_ids.extend(self.prompt)
            for lp in prompt_logprobs or ():
                _public_logprobs(lp, chunk.prompt_logprobs.add())
            self.prompt = None
        return resp, self.matched is not None or why is not None

    def complete(self, rid: str, prompt_tokens: int) -> gateway_pb2.Complete:
        done = gateway_pb2.Complete(finish_reason=FINISH[self.finish], request_id=rid,
                                    usage=gateway_pb2.Usage(prompt_tokens=prompt_tokens,
                                                            completion_tokens=self.generated))
        if self.matched is not None:
            done.stop_string = self.matched
        return done


class Generation:
    """Validation, admission, flow and detokenization of one request; GatewayError on failure."""

    def __init__(self, model: ModelInfo, tokenizer: Tokenizer, router: Router, admission: Admission | None = None,
                 guides: GuideCompiler | None = None) -> None:
        self.model = model
        self.guides = guides  # compiles structured output's guides (None: the model has no tokenizer.json)
        self.tokenizer = tokenizer
        self.defaults = dict(model.sampling_defaults)  # the model's sampling defaults (gateway.sampling_defaults)
        self.router = router
        self.admission = admission or Admission()
        self.byte_table = ByteTable.build(tokenizer)  # once: per-token detokenization by table lookup

    def check_model(self, name: str) -> None:
        """ValidationError naming `model` unless name is empty (this gateway's model) or its name."""
        if name and name != self.model.name:
            raise ValidationError("model", f"{UNKNOWN_MODEL} {name!r}; this gateway serves {self.model.name!r}")

    def chat_text(self, chat: gateway_pb2.ChatMessages) -> str:
        """A chat prompt's text as the template renders it with the request's options (special
        tokens included), or ValidationError naming chat.<field>."""
        try:
            return render_chat(self.tokenizer, chat.messages, chat.tools,
                               add_generation_prompt=not chat.HasField("add_generation_prompt")
                               or chat.add_generation_prompt,
                               continue_final_message=chat.continue_final_message,
                               template_kwargs=template_variables(chat.template_kwargs))
        except ValidationError as e:
            raise ValidationError(_public_field("chat", e.field), str(e).split(": ", 1)[-1]) from None

    def encode_chat(self, chat: gateway_pb2.ChatMessages) -> list[int]:
        """A chat prompt's token ids (see chat_text)."""
        return encode_rendered(self.tokenizer, self.chat_text(chat))

    def prepare(self, req: gateway_pb2.GenerateRequest, fill_max_tokens: bool = False) -> tuple[list[int], SamplingParams]:
        """Prompt ids and sampling params, or ValidationError naming the field.

        fill_max_tokens: an unset max_tokens means the rest of the context (OpenAI chat), not 16
        (at most the model's default max_tokens, where it has one).
        """
        self.check_model(req.model)
        params = sampling_from_request(req.sampling, self.defaults)
        if req.priority:
            params = dataclasses.replace(params, priority=req.priority)
        try:
            params.validate(self.model.vocab_size)
        except ValidationError as e:
            raise _public_guide_error(req, e) from None
        kind = req.WhichOneof("input")
        try:
            if kind == "text":
                ids = encode_prompt(self.tokenizer, text=req.text)
            elif kind == "chat":
                ids = self.encode_chat(req.chat)
            elif kind == "token_ids":
                ids = encode_prompt(self.tokenizer, token_ids=list(req.token_ids.ids))
            else:
                raise ValidationError("input", "set one of text, chat or token_ids")
            ids = _truncated(ids, req.sampling, self.model.max_model_len)
            if fill_max_tokens and not req.sampling.HasField("max_tokens"):
                rest = max(1, self.model.max_model_len - len(ids))
                params = dataclasses.replace(params, max_tokens=min(rest, self.defaults.get("max_tokens", rest)))
            validate_prompt(ids, params.max_tokens, self.model.vocab_size, self.model.max_model_len)
        except ValidationError as e:
            raise ValidationError(_public_field(kind, e.field), str(e).split(": ", 1)[-1]) from None
        if any(t >= self.model.vocab_size for t in params.stop_token_ids):
            raise ValidationError("sampling.stop_token_ids", "token id outside the vocabulary")
        return ids, params

    async def _check_guide(self, req: gateway_pb2.GenerateRequest, params: SamplingParams) -> None:
        """Compile the request's guide (off the event loop: a big grammar takes 0.1-1 s), so that
        a bad one is refused before dispatch, naming sampling.structured_output.<kind>."""
        if params.guide is None:
            return
        try:
            if self.guides is None:
                raise ValidationError("guide", "structured output is off on this gateway: its model folder has no "
                                      "tokenizer.json that llguidance can read (see its log)")
            await asyncio.to_thread(self.guides.check, params.guide)
        except ValidationError as e:
            e = _public_guide_error(req, e)
            raise invalid(e) from None

    def _checked(self, request, fill_max_tokens: bool) -> tuple[list[int], SamplingParams]:
        if isinstance(request, BadRequest):
            raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT, request.reason, field=request.reason.split(":")[0])
        try:
            return self.prepare(request, fill_max_tokens)
        except ValidationError as e:
            raise invalid(e) from None

    async def stream(self, request, rid: str, deadline: Deadline,
                     fill_max_tokens: bool = False) -> AsyncIterator[gateway_pb2.GenerateResponse]:
        """Chunks, then one Complete; raises GatewayError (before or after chunks were sent)."""
        prompt, params = self._checked(request, fill_max_tokens)
        await self._check_guide(request, params)
        with self.admission.enter() as ticket:
            job = flow.Job(rid, prompt, sampling_to_wire(params), self._first_finishes(prompt, params))
            text = TextAssembler(self.tokenizer, prompt, params, self.byte_table, request.sampling)
            try:
                async with contextlib.aclosing(flow.run(job, self.router, deadline)) as tokens:
                    async for batch in tokens:
                        ticket.started()
                        resp, done = text.feed(batch.ids, batch.finish, batch.logprobs, batch.prompt_logprobs)
                        yield resp
                        if done:
                            break
            except grpc.aio.AioRpcError as e:
                code = e.code() if e.code() in PASSED_ON else grpc.StatusCode.UNAVAILABLE
                raise GatewayError(code, f"worker error: {e.details()}") from None
            except NoWorker as e:
                raise GatewayError(grpc.StatusCode.UNAVAILABLE, str(e)) from None
            yield gateway_pb2.GenerateResponse(complete=text.complete(rid, len(prompt)))

    def _first_finishes(self, prompt: list[int], params: SamplingParams):
        def check(token: int) -> str | None:
            seq = Sequence("", prompt, params, self.model.eos_ids, output_ids=[token])
            why = check_finish(seq, self.model.max_model_len)
            return None if why is None else why.value

        return check


def _truncated(ids: list[int], s: gateway_pb2.SamplingParams, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens: the prompt's last N tokens (-1: max_model_len - 1)."""
    if not s.HasField("truncate_prompt_tokens"):
        return ids
    n = s.truncate_prompt_tokens
    if n == -1:
        n = max_model_len - 1
    if n < 1:
        raise ValidationError("sampling.truncate_prompt_tokens", f"must be >= 1 or -1, got {s.truncate_prompt_tokens}")
    return ids[-n:]


def _public_logprobs(lp, out: gateway_pb2.TokenLogprobs) -> None:
    """A worker's WorkerLogprobs as the public TokenLogprobs `out` (an added repeated entry)."""
    out.logprob = lp.logprob
    out.top_token_ids.extend(lp.top_token_ids)
    out.top_logprobs.extend(lp.top_logprobs)
    if lp.HasField("rank"):
        out.rank = lp.rank


def _public_guide_error(req: gateway_pb2.GenerateRequest, e: ValidationError) -> ValidationError:
    """e, naming sampling.structured_output.<kind> where it names the guide."""
    if e.field != "guide":
        return e
    where = f"sampling.structured_output.{req.sampling.structured_output.WhichOneof('kind')}"
    return ValidationError(where, str(e).split(": ", 1)[-1])


def _public_field(kind: str | None, field: str) -> str:
    if field.startswith(("messages", "tools", "template_kwargs", "continue_final_message")):
        return "chat." + field
    if field == "prompt_token_ids":
        return "token_ids.ids"
    if field == "prompt":
        return {"text": "text", "chat": "chat.messages", "token_ids": "token_ids.ids"}.get(kind or "", "input")
    return field
