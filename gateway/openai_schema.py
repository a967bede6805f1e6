"""OpenAI request bodies -> GenerateRequest, and GenerateResponse pieces -> OpenAI JSON objects.

Every problem with a body is a GatewayError(INVALID_ARGUMENT) whose `field` is the OpenAI
parameter name, so the HTTP face can answer 400 with `param` set.

Token logprobs (`logprobs`, and `top_logprobs` on chat) are each choice's, built chunk by chunk by
ChoiceLogprobs: a streamed event carries the logprobs of the tokens of the gateway chunk it was
made from (text held back for an incomplete character or a possible stop string goes out later,
its tokens' logprobs do not wait), so the events' entries, joined, are the whole response's.

The prompt's logprobs come with a generation's first chunk (SamplingParams.prompt_logprobs); they
answer two requests: `echo` with `logprobs` on /v1/completions (legacy OpenAI, what
lm-evaluation-harness scores with: the choice's logprobs start with the prompt's tokens, the first
one's logprob null) and vLLM's `prompt_logprobs` extension (`vllm_prompt_logprobs`).

Structured output (SamplingParams.structured_output) is asked for as OpenAI does (`response_format`
json_object or json_schema) or as vLLM's server does (`guided_json`, `guided_regex`,
`guided_choice`, `guided_grammar`, or the `structured_outputs` object), one of them per request;
the gateway compiles it, and its errors name the parameter the body used (`as_sent`).
"""

from __future__ import annotations

import codecs
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc

from gateway import chat_answer, tools
from gateway.detokenizer import ByteTable
from gateway.hf_tokenizer import Tokenizer
from gateway.errors import GatewayError, bad
from gateway.generation import sampling_from_request
from gateway.reasoning import Reasoning
from pdserve.core.request import Finish, Sequence, check_finish
from pdserve.core.sampling import MAX_LOGPROBS
from pdserve.proto import gateway_pb2

FINISH_NAMES = {gateway_pb2.FINISH_REASON_STOP: "stop", gateway_pb2.FINISH_REASON_LENGTH: "length",
                gateway_pb2.FINISH_REASON_ABORT: "abort"}
MAX_CHOICES = 128  # prompts x n in one request: each choice is a generation of its own
FLAGS = ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output")  # vLLM's booleans
NUMBERS = {"truncate_prompt_tokens": int, "temperature": float, "top_p": float, "top_k": int, "seed": int, "max_tokens": int, "min_tokens": int,
           "presence_penalty": float, "frequency_penalty": float, "repetition_penalty": float, "min_p": float}
# Parameters this server does not implement, with the values that ask for nothing (accepted as
# if absent). Anything else is refused by name rather than ignored: a body asking for tools or a
# suffix must not get plain sampling that looks like success.
UNSUPPORTED: dict[str, tuple] = {
    "best_of": (1,),
    "suffix": ("",), "tools": ([],), "functions": ([],),
    "tool_choice": ("none", "auto"), "function_call": ("none", "auto"),
    "chat_template": (),  # a request's own template (vLLM's): the gateway's --chat-template only
    # vLLM's sampling extras not implemented, accepted only as their do-nothing values
    "allowed_token_ids": ([],), "bad_words": ([],), "use_beam_search": (False,), "length_penalty": (1, 1.0),
    "spaces_between_special_tokens": (True,), "return_tokens_as_token_ids": (False,),
}
# The parameters that ask for structured output, in the order a conflict between them is told.
STRUCTURED = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
              "structured_outputs")
# vLLM's structured_outputs: the kinds it may ask for, and its options, taken as absent when false.
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
STRUCTURED_OPTIONS = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties")


def _number(body: dict, name: str, kind: type) -> int | float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise bad(name, f"must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def echo(body: dict, chat: bool) -> bool:
    """/v1/completions' `echo`: the answer's text starts with the prompt's (and with `logprobs`,
    its logprobs with the prompt tokens'). Not on chat, as OpenAI."""
    value = body.get("echo")
    if value is None or value is False:
        return False
    if chat:
        raise bad("echo", "is not supported on /v1/chat/completions")
    if not isinstance(value, bool):
        raise bad("echo", f"must be a boolean, got {value!r:.40}")
    return True


def asked_prompt_logprobs(body: dict) -> int | None:
    """vLLM's `prompt_logprobs` extension: None, or how many alternatives each prompt position
    lists (0..20). Not with `stream` (as vLLM: streamed events have no place for them)."""
    value = _alternatives(body, "prompt_logprobs")
    if value is not None and body.get("stream") is True:
        raise bad("prompt_logprobs", "is not available with stream: true")
    return value


def _prompt_logprobs(body: dict, chat: bool, logprobs: int | None) -> int | None:
    """SamplingParams.prompt_logprobs for a body: enough alternatives for vLLM's extension and, on
    /v1/completions, for echo with logprobs (whose echoed tokens carry `logprobs` alternatives)."""
    wanted = [asked_prompt_logprobs(body)]
    if not chat and body.get("echo") is True:
        wanted.append(logprobs)
    given = [n for n in wanted if n is not None]
    return max(given) if given else None


def sampling(body: dict, chat: bool) -> gateway_pb2.SamplingParams:
    """The sampling fields of a completions or chat body (unset ones stay unset)."""
    for name, neutral in UNSUPPORTED.items():
        value = body.get(name)
        if chat and name in ("tools", "tool_choice"):  # gateway.tools reads them
            continue
        if value is not None and not any(_same(value, v) for v in neutral):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            raise bad(name, f"{shown} is not supported by this server" if neutral else "is not supported by this server")
    if body.get("max_completion_tokens") is not None and body.get("max_tokens") is None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    s = gateway_pb2.SamplingParams()
    for name, kind in NUMBERS.items():
        value = _number(body, name, kind)
        if value is not None:
            try:
                setattr(s, name, value)
            except ValueError:  # outside the proto field's integer range (seed -1, top_k 2^40)
                raise bad(name, f"out of range, got {value}") from None
    s.stop.extend(_strings(body.get("stop"), "stop"))
    ids = body.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise bad("stop_token_ids", "must be a list of integers")
    s.stop_token_ids.extend(ids)
    for name in FLAGS:
        if body.get(name) is not None:
            if not isinstance(body[name], bool):
                raise bad(name, "must be a boolean")
            setattr(s, name, body[name])
    for token, bias in _logit_bias(body.get("logit_bias")).items():
        s.logit_bias[token] = bias
    logprobs = _chat_logprobs(body) if chat else _completion_logprobs(body)
    if logprobs is not None:
        s.logprobs = logprobs
    prompt = _prompt_logprobs(body, chat, logprobs)
    if prompt is not None:
        s.prompt_logprobs = prompt
    asked = _structured_output(body)
    if asked is not None:
        s.structured_output.CopyFrom(asked[1])
    return s


def _structured_output(body: dict) -> tuple[str, gateway_pb2.StructuredOutput] | None:
    """The structured output a body asks for, with the parameter that asks for it (what an error
    about it names: e.g. response_format.json_schema.schema, guided_regex, structured_outputs.choice),
    or None. Only one of the STRUCTURED parameters may ask for one."""
    found: tuple[str, gateway_pb2.StructuredOutput] | None = None
    for name in STRUCTURED:
        value = body.get(name)
        if value is None:
            continue
        if name == "response_format":
            asked = _response_format(value)
        elif name == "structured_outputs":
            asked = _vllm_structured_outputs(value)
        else:
            asked = name, _structured_kind(name[len("guided_"):], value, name)
        if asked is None:
            continue
        if found is not None:
            raise bad(name, f"only one kind of structured output may be given ({found[0]} asks for one already)")
        found = asked
    return _whitespace(body, found)


def _whitespace(body: dict, found: tuple[str, gateway_pb2.StructuredOutput] | None
                ) -> tuple[str, gateway_pb2.StructuredOutput] | None:
    """vLLM's guided_whitespace_pattern (or structured_outputs.whitespace_pattern): the whitespace
    JSON output may have between its tokens, instead of none (separators ", " and ": " then become
    "," and ":" plus that whitespace). It goes into the schema as llguidance's x-guidance options."""
    outputs = body.get("structured_outputs")
    param, pattern = "guided_whitespace_pattern", body.get("guided_whitespace_pattern")
    if isinstance(outputs, dict) and outputs.get("whitespace_pattern") is not None:
        if pattern is not None:
            raise bad("structured_outputs.whitespace_pattern", "guided_whitespace_pattern gives one already")
        param, pattern = "structured_outputs.whitespace_pattern", outputs["whitespace_pattern"]
    if pattern is None:
        return found
    if not isinstance(pattern, str) or not pattern:
        raise bad(param, f"must be a non-empty regular expression, got {pattern!r:.40}")
    kind = found[1].WhichOneof("kind") if found is not None else None
    if found is None or kind not in ("json_schema", "json_object"):
        raise bad(param, "applies to JSON output only (a JSON schema or json_object)")
    schema = json.loads(found[1].json_schema) if kind == "json_schema" else {"type": "object"}
    if not isinstance(schema.get("x-guidance", {}), dict):
        raise bad(found[0], "its x-guidance must be an object of llguidance's JSON options")
    schema["x-guidance"] = {**schema.get("x-guidance", {}), "whitespace_pattern": pattern,
                            "item_separator": ",", "key_separator": ":"}
    return found[0], gateway_pb2.StructuredOutput(json_schema=json.dumps(schema))


def _response_format(value: Any) -> tuple[str, gateway_pb2.StructuredOutput] | None:
    """OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"} or
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}."""
    if not isinstance(value, dict):
        raise bad("response_format", f'must be an object like {{"type": "json_object"}}, got {value!r:.60}')
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "response_format", gateway_pb2.StructuredOutput(json_object=True)
    if kind != "json_schema":
        raise bad("response_format.type", f"must be one of text, json_object, json_schema, got {kind!r:.40}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad("response_format.json_schema", 'must be an object like {"name": "...", "schema": {...}}')
    if spec.get("name") is not None and not isinstance(spec["name"], str):
        raise bad("response_format.json_schema.name", f"must be a string, got {spec['name']!r:.40}")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad("response_format.json_schema.strict", f"must be a boolean, got {spec['strict']!r:.40}")
    param = "response_format.json_schema.schema"
    if spec.get("schema") is None:
        raise bad(param, "is missing: the JSON schema the output must follow")
    return param, gateway_pb2.StructuredOutput(json_schema=_schema_text(spec["schema"], param, text=False))


def _vllm_structured_outputs(value: Any) -> tuple[str, gateway_pb2.StructuredOutput] | None:
    """vLLM's structured_outputs object: one of json (a schema), regex, choice, grammar or
    json_object (true); null members, json_object false and options left false (STRUCTURED_OPTIONS)
    ask for nothing."""
    if not isinstance(value, dict):
        raise bad("structured_outputs", f"must be an object with one of {', '.join(STRUCTURED_KINDS)}")
    found: tuple[str, gateway_pb2.StructuredOutput] | None = None
    for key, member in value.items():
        param = f"structured_outputs.{key}"
        if member is None or (key in (*STRUCTURED_OPTIONS, "json_object") and member is False):
            continue
        if key == "whitespace_pattern":  # an option of json (_whitespace)
            continue
        if key not in STRUCTURED_KINDS:
            raise bad(param, f"is not supported by this server (give one of {', '.join(STRUCTURED_KINDS)})")
        if key == "json_object" and member is not True:
            raise bad(param, f"must be a boolean, got {member!r:.40}")
        if found is not None:
            raise bad(param, f"only one kind of structured output may be given ({found[0]} asks for one already)")
        found = param, _structured_kind(key, member, param)
    return found


def _structured_kind(kind: str, value: Any, param: str) -> gateway_pb2.StructuredOutput:
    """The StructuredOutput for one of vLLM's kinds (json, regex, choice, grammar, json_object
    true), given as body parameter `param`."""
    if kind == "json":
        return gateway_pb2.StructuredOutput(json_schema=_schema_text(value, param, text=True))
    if kind == "json_object":
        return gateway_pb2.StructuredOutput(json_object=True)
    if kind == "choice":
        if not (isinstance(value, list) and value and all(isinstance(c, str) and c for c in value)):
            raise bad(param, "must be a non-empty list of non-empty strings")
        return gateway_pb2.StructuredOutput(choice=gateway_pb2.Choices(choices=value))
    what = "a regular expression" if kind == "regex" else "a Lark grammar"
    if not isinstance(value, str) or not value:
        raise bad(param, f"must be a non-empty string ({what}), got {value!r:.40}")
    return gateway_pb2.StructuredOutput(**{kind: value})


def _schema_text(value: Any, param: str, text: bool) -> str:
    """A JSON schema (a JSON object) as JSON text; `text`: it may also come as a string of JSON."""
    if text and isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError as e:
            raise bad(param, f"is not valid JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise bad(param, f"must be a JSON schema (a JSON object), got {value!r:.40}")
        return value
    if not isinstance(value, dict):
        raise bad(param, f"must be a JSON schema (a JSON object{', or a string of one' if text else ''}), "
                         f"got {value!r:.40}")
    return json.dumps(value)


def as_sent(e: GatewayError, body: dict) -> GatewayError:
    """e naming the body's parameter where it names the gateway's structured output
    (sampling.structured_output.<kind>, refused when compiled): response_format.json_schema.schema,
    guided_json, structured_outputs.regex, ... as the body asked, or the tools' parameters where
    tool_choice asked for it; any other error as it is."""
    if not (e.field or "").startswith("sampling.structured_output"):
        return e
    asked = _structured_output(body)
    if asked is not None:
        param = asked[0]
    elif body.get("tools"):  # tool_choice's guide: a named function's parameters, or all of them
        named = body.get("tool_choice") if isinstance(body.get("tool_choice"), dict) else {}
        names = [t.get("function", {}).get("name") for t in body["tools"]]
        name = (named.get("function") or {}).get("name")
        param = f"tools[{names.index(name)}].function.parameters" if name in names else "tools"
    else:
        return e
    tail = e.message[len(e.field):] if e.message.startswith(e.field + ":") else f": {e.message}"
    return GatewayError(e.code, param + tail, e.retry_after_ms, param)


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's logit_bias, {"token id": bias}, as {id: bias} (ranges are checked with the other
    sampling fields, against the vocabulary)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad("logit_bias", f"must be an object of token id -> bias, got {value!r:.80}")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            raise bad("logit_bias", f"keys must be token ids, got {key!r:.40}") from None
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise bad("logit_bias", f"the bias of token {token} must be a number, got {bias!r:.40}")
        if not -2**63 <= token < 2**63:
            raise bad("logit_bias", f"token id {token} is outside the vocabulary")
        out[token] = float(bias)
    return out


def _alternatives(body: dict, name: str) -> int | None:
    """body[name] as a number of most likely tokens to list: None or an integer in [0, MAX_LOGPROBS]."""
    value = _number(body, name, int)
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise bad(name, f"must be in [0, {MAX_LOGPROBS}], got {value}")
    return value


def _completion_logprobs(body: dict) -> int | None:
    """/v1/completions: `logprobs` is null (none) or how many alternatives each token lists."""
    if _alternatives(body, "top_logprobs"):  # 0 asks for nothing
        raise bad("top_logprobs", "is a chat parameter; on /v1/completions set logprobs to the number of alternatives")
    return _alternatives(body, "logprobs")


def _chat_logprobs(body: dict) -> int | None:
    """/v1/chat/completions: `logprobs` true asks for them, with `top_logprobs` alternatives (default 0)."""
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise bad("logprobs", f"must be a boolean, got {wanted!r}")
    top = _alternatives(body, "top_logprobs")
    if top and not wanted:  # 0 asks for nothing
        raise bad("top_logprobs", "needs logprobs: true")
    return (top or 0) if wanted else None


def _same(value: Any, neutral: Any) -> bool:
    """value == neutral without True == 1 or 0 == False crossing between booleans and numbers."""
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


def _strings(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise bad(name, "must be a string or a list of strings")


def model_name(body: dict) -> str:
    model = body.get("model") or ""
    if not isinstance(model, str):
        raise bad("model", "must be a string")
    return model


def priority(body: dict) -> int:
    """vLLM's request priority (lower first; default 0)."""
    value = body.get("priority", 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31:
        raise bad("priority", f"must be a 32-bit integer, got {value!r:.40}")
    return value


def completion_requests(body: dict) -> list[gateway_pb2.GenerateRequest]:
    """One GenerateRequest per prompt of a /v1/completions body: a string, a list of token ids,
    or a list of either (a batch)."""
    prompt = body.get("prompt")
    batch = isinstance(prompt, list) and bool(prompt) and all(isinstance(p, (str, list)) for p in prompt)
    if batch and len(prompt) > MAX_CHOICES:
        raise bad("prompt", f"at most {MAX_CHOICES} prompts per request, got {len(prompt)}")
    params, model, rank = sampling(body, chat=False), model_name(body), priority(body)
    reqs = []
    for i, p in enumerate(prompt if batch else [prompt]):
        req = gateway_pb2.GenerateRequest(model=model, sampling=params, priority=rank)
        if isinstance(p, str):
            req.text = p
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            req.token_ids.ids.extend(p)
        else:
            raise bad(f"prompt[{i}]" if batch else "prompt",
                      "must be a non-empty string or list of token ids, or a list of those")
        reqs.append(req)
    return reqs


def chat_request(body: dict, tool_parser: str | None = None) -> gateway_pb2.GenerateRequest:
    """A GenerateRequest from a /v1/chat/completions body. Its tools go to the chat template; a
    tool_choice of a named function or "required" constrains the output (so not with another
    structured output); `tool_choice` reads what it asks of the answer."""
    req = gateway_pb2.GenerateRequest(model=model_name(body), sampling=sampling(body, chat=True), priority=priority(body))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}]", "must be an object with a string role")
        msg = req.chat.messages.add(role=m["role"], content=_content(m.get("content"), i))
        _tool_fields(msg, m, i)
    req.chat.tools.extend(tools.parse_tools(body))
    _template_options(req.chat, body)
    choice = tools.parse_choice(body, list(req.chat.tools), tool_parser)
    wanted = tools.guide(choice, list(req.chat.tools))
    if wanted is not None:
        asked = _structured_output(body)
        if asked is not None:
            what = {"named": "a named function", "required": '"required"', "auto": '"auto" with strict tools'}
            raise bad("tool_choice", f"{what[choice.mode]} constrains the output: not with {asked[0]}")
        req.sampling.structured_output.CopyFrom(wanted)
    return req


def include_reasoning(body: dict) -> bool:
    """vLLM's include_reasoning (default true): false leaves a thinking model's reasoning out."""
    value = body.get("include_reasoning", True)
    if not isinstance(value, bool):
        raise bad("include_reasoning", f"must be a boolean, got {value!r:.40}")
    return value


def tool_choice(body: dict, req: gateway_pb2.GenerateRequest, tool_parser: str | None) -> tools.ToolChoice | None:
    """What a chat body (made into req by chat_request) asks of its answer's tool calls: None
    where the answer is plain text (no tools, or tool_choice "none")."""
    choice = tools.parse_choice(body, list(req.chat.tools), tool_parser)
    return None if choice.mode == "none" else choice


def _template_options(chat: gateway_pb2.ChatMessages, body: dict) -> None:
    """vLLM's chat_template_kwargs (an object of template variables), add_generation_prompt and
    continue_final_message into chat; their values are checked where the template is rendered."""
    variables = body.get("chat_template_kwargs")
    if variables is not None:
        if not isinstance(variables, dict):
            raise bad("chat_template_kwargs", f"must be an object of template variables, got {variables!r:.40}")
        chat.template_kwargs = json.dumps(variables)
    for name in ("add_generation_prompt", "continue_final_message"):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise bad(name, f"must be a boolean, got {value!r:.40}")
    if body.get("add_generation_prompt") is not None:
        chat.add_generation_prompt = body["add_generation_prompt"]
    chat.continue_final_message = body.get("continue_final_message") or False


def _tool_fields(msg: gateway_pb2.ChatMessage, m: dict, i: int) -> None:
    """An assistant message's tool_calls, a tool message's tool_call_id and name, into msg."""
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                raise bad(f"messages[{i}].{key}", f"must be a string, got {m[key]!r:.40}")
            setattr(msg, key, m[key])
    calls = m.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise bad(f"messages[{i}].tool_calls", "must be a list of tool calls")
    for j, c in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad(f"{where}.function", 'must be an object like {"name": ..., "arguments": "{...}"}')
        arguments = fn.get("arguments", "{}")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise bad(f"{where}.function.arguments", f"must be the JSON text of an object, got {arguments!r:.40}")
        msg.tool_calls.add(id=str(c.get("id") or ""), name=fn["name"], arguments=arguments)


def samples(body: dict, reqs: list[gateway_pb2.GenerateRequest]) -> list[gateway_pb2.GenerateRequest]:
    """`n` copies of each request, in OpenAI's choice order (prompt by prompt). With a seed,
    copy j draws with seed + j, so the n choices differ yet repeat with the same body."""
    n = body.get("n")
    n = 1 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad("n", f"must be an integer >= 1, got {n!r}")
    if n * len(reqs) > MAX_CHOICES:
        raise bad("n", f"n ({n}) x prompts ({len(reqs)}) exceeds {MAX_CHOICES} choices per request")
    out = []
    for req in reqs:
        for j in range(n):
            copy = gateway_pb2.GenerateRequest()
            copy.CopyFrom(req)
            if j and req.sampling.HasField("seed"):
                copy.sampling.seed = (req.sampling.seed + j) % 2**63
            out.append(copy)
    return out


def _content(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):  # null: an assistant message of tool calls
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad(f"messages[{i}].content", "must be a string or a list of text parts")


def openai_param(field: str | None) -> str | None:
    """The OpenAI parameter for a gateway field name (sampling.top_p -> top_p, text -> prompt)."""
    if field is None:
        return None
    if field.startswith("sampling."):
        return field[len("sampling."):]
    if field.startswith("chat.template_kwargs"):
        return "chat_" + field[len("chat."):]
    if field.startswith("chat."):
        return field[len("chat."):]
    return {"text": "prompt", "token_ids.ids": "prompt", "input": "prompt"}.get(field, field)


def usage(done: gateway_pb2.Complete) -> dict:
    u = done.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def envelope(kind: str, rid: str, model: str, choices: list[dict]) -> dict:
    """The common frame of every completion object and chunk."""
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices}


def choice(chat: bool, text: str, finish: str | None, delta: bool, first: bool = False, index: int = 0,
           logprobs: dict | None = None, tool_choice: tools.ToolChoice | None = None,
           reasoning: Reasoning | None = None) -> dict:
    """One choice: chat message/delta or completion text, with its logprobs and finish reason; a
    whole chat answer has its reasoning and tool calls read out of the text (chat_answer.message)."""
    if not chat:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    if not delta:
        message, finish = chat_answer.message(text, finish, reasoning, tool_choice)
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
    d = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
    return delta_choice(d, finish, index, logprobs)


def delta_choice(delta: dict, finish: str | None, index: int, logprobs: dict | None = None) -> dict:
    """A streamed chat choice with the given delta."""
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


class TokenText:
    """Each token id as logprobs show it: its bytes (what it adds to a decoded text; a special
    token's own text, e.g. "<|im_end|>") and its string. A token that is not valid UTF-8 alone (part
    of a character) is written as OpenAI writes such tokens (vLLM too): "bytes:" and each of its bytes
    escaped, e.g. "bytes:\\x20\\xe5\\x88" (never U+FFFD: tokens of different bytes stay apart)."""

    def __init__(self, tokenizer: Tokenizer, table: ByteTable | None) -> None:
        if table is not None:
            self.piece: Callable[[int], bytes] = table.pieces.__getitem__
            self.special = table.special
        else:  # a non-byte-level tokenizer: the token decoded alone (a SentencePiece word may lose its space)
            self.piece = lambda t: tokenizer.decode([t], skip_special_tokens=False,
                                                    clean_up_tokenization_spaces=False).encode()
            self.special = frozenset(tokenizer.all_special_ids)

    def string(self, token: int) -> str:
        """The token's text alone, or its "bytes:\\x.." form."""
        data = self.piece(token)
        try:
            return data.decode()
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def _logprob(value: float) -> float:
    """A logprob JSON can carry: -inf (a token the model rules out) becomes -9999.0, as in vLLM."""
    return max(value, -9999.0)


def merge_logprobs(into: dict, part: dict) -> None:
    """Append part's entries (ChoiceLogprobs.part) to into's, field by field."""
    for key, entries in part.items():
        into[key].extend(entries)


class ChoiceLogprobs:
    """One choice's OpenAI `logprobs` object, chunk by chunk (`part`).

    Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, where a top_logprobs
    entry maps the most likely tokens to their logprobs (only those alternatives: the chosen token is
    in it when it is one of them, as OpenAI does; vLLM adds it) and text_offset is the character
    offset of the token's text in the completion's text. Chat: {"content": [{"token", "logprob",
    "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.

    A token the worker stopped on (EOS or a stop token id) adds no text, and is left out as OpenAI
    does; every other token is in, those cut off by a stop string too (as in vLLM). With echo, the
    prompt's tokens come first (`prompt_part`), and the generated tokens' offsets follow the prompt's text."""

    def __init__(self, chat: bool, req: gateway_pb2.GenerateRequest, words: TokenText,
                 eos_ids: tuple[int, ...]) -> None:
        self.chat, self.words = chat, words
        self.width = req.sampling.logprobs  # alternatives per entry (the prompt's may carry more)
        self.seq = Sequence("", [], sampling_from_request(req.sampling), eos_ids)  # the worker's view, for stops
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # as the detokenizer: text_offset
        self.offset = 0

    def empty(self) -> dict:
        """The object with no entries."""
        if self.chat:
            return {"content": []}
        return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def part(self, chunk: gateway_pb2.Chunk) -> dict:
        """The object for chunk's tokens (in order, after the chunks before it)."""
        if len(chunk.logprobs) != len(chunk.token_ids):
            raise GatewayError(grpc.StatusCode.INTERNAL,
                               f"{len(chunk.logprobs)} logprobs for {len(chunk.token_ids)} tokens")
        out = self.empty()
        kept = len(chunk.token_ids) - self._stopped_on(chunk)
        for token, lp in zip(chunk.token_ids[:kept], chunk.logprobs):
            if self.chat:
                out["content"].append({**self._word(token, lp.logprob), "top_logprobs": [
                    self._word(t, v) for t, v in zip(lp.top_token_ids, lp.top_logprobs)]})
            else:
                out["tokens"].append(self.words.string(token))
                out["token_logprobs"].append(_logprob(lp.logprob))
                out["top_logprobs"].append({self.words.string(t): _logprob(v)
                                            for t, v in zip(lp.top_token_ids, lp.top_logprobs)})
                out["text_offset"].append(self.offset)
                if token not in self.words.special:  # the detokenizer skips them
                    self.offset += len(self.utf8.decode(self.words.piece(token)))
        return out

    def prompt_part(self, chunk: gateway_pb2.Chunk, text: str) -> dict:
        """Completions' echo: the object for the prompt's tokens, from the first chunk (its
        prompt_token_ids and prompt_logprobs), before any `part`. The first token has nothing
        before it: null logprob and top_logprobs (as OpenAI and vLLM). text_offset counts the
        characters of the prompt's tokens before each (special tokens' text included: the echoed
        `text`, the prompt decoded, has it); the generated tokens' offsets continue after `text`."""
        out = self.empty()
        utf8, offset = codecs.getincrementaldecoder("utf-8")("replace"), 0
        for token, lp in prompt_entries(chunk):
            out["tokens"].append(self.words.string(token))
            out["token_logprobs"].append(None if lp is None else _logprob(lp.logprob))
            out["top_logprobs"].append(None if lp is None else {
                self.words.string(t): _logprob(v) for t, v in zip(lp.top_token_ids[:self.width], lp.top_logprobs)})
            out["text_offset"].append(offset)
            offset += len(utf8.decode(self.words.piece(token)))
        self.offset = len(text)
        return out

    def _stopped_on(self, chunk: gateway_pb2.Chunk) -> bool:
        """Whether the worker stopped on chunk's last token (then the chunk is the last one). STOP is
        decided before any length, so the lengths check_finish is given do not matter here."""
        self.seq.output_ids.extend(chunk.token_ids)
        return bool(chunk.token_ids) and check_finish(self.seq, sys.maxsize) is Finish.STOP

    def _word(self, token: int, logprob: float) -> dict:
        """A chat entry's token, logprob and bytes."""
        return {"token": self.words.string(token), "logprob": _logprob(logprob), "bytes": list(self.words.piece(token))}


def prompt_entries(chunk: gateway_pb2.Chunk) -> list[tuple[int, gateway_pb2.TokenLogprobs | None]]:
    """(token id, its logprobs) for each prompt token of a generation's first chunk; the first
    token's are None (nothing comes before it). An INTERNAL error where the chunk lacks them."""
    ids, entries = chunk.prompt_token_ids, chunk.prompt_logprobs
    if not ids or len(entries) != len(ids) - 1:
        raise GatewayError(grpc.StatusCode.INTERNAL, f"{len(entries)} prompt logprobs for a {len(ids)}-token prompt")
    return list(zip(ids, [None, *entries]))


def vllm_prompt_logprobs(chunk: gateway_pb2.Chunk, width: int, words: TokenText) -> list[dict | None]:
    """vLLM's `prompt_logprobs` from a generation's first chunk: null for the first prompt token,
    then per position {"<token id>": {"logprob", "rank", "decoded_token"}} for the prompt's actual
    token (first) and the `width` most likely tokens (rank 1..width, most likely first).

    The actual token's rank is its rank in the whole vocabulary, as vLLM gives it: the workers
    send it with each prompt entry (TokenLogprobs.rank). Without it (an older worker) it is the
    token's place among the top `width` when it is one of them, else null (never a made-up
    number). decoded_token is the token's text as the logprobs' tokens show it (TokenText:
    "bytes:\\x.." for part of a character)."""
    out: list[dict | None] = [None]
    for token, lp in prompt_entries(chunk)[1:]:
        tops = list(zip(lp.top_token_ids[:width], lp.top_logprobs))
        ranks = {t: r for r, (t, _) in enumerate(tops, 1)}
        rank = lp.rank if lp.HasField("rank") else ranks.get(token)
        entry = {str(token): {"logprob": _logprob(lp.logprob), "rank": rank, "decoded_token": words.string(token)}}
        for r, (t, v) in enumerate(tops, 1):
            entry.setdefault(str(t), {"logprob": _logprob(v), "rank": r, "decoded_token": words.string(t)})
        out.append(entry)
    return out
