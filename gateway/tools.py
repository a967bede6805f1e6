"""Tool calling on the OpenAI face: `tools` and `tool_choice` in, `tool_calls` out.

The gRPC API carries the tools to the chat template (ChatMessages.tools) and a structured output;
this module maps OpenAI's parameters onto those and reads the calls back out of the text:

- `tool_choice` {"type": "function", "function": {"name": N}}: the output is constrained to N's
  parameters schema and is N's arguments (finish_reason "stop", as OpenAI for a forced function);
- "required": the output is constrained to a JSON array of {"name", "parameters"} items, one of
  the tools each, at least one (one at most with parallel_tool_calls false): finish "tool_calls";
- "auto" (the default when tools are given): the model writes freely and the gateway's
  --tool-call-parser reads its calls out of the text (`hermes`: <tool_call>{...}</tool_call>
  blocks after any text, Qwen2.5/3 and Hermes models; `llama3_json`: an answer that is one or
  more {"name", "parameters"} objects, Llama 3.1/3.2; `mistral`: an answer that is a JSON array
  of {"name", "arguments"} objects, maybe after [TOOL_CALLS], Mistral); without a parser "auto"
  is refused by name, as vLLM does (the calls could not be told from text); with a tool marked strict, the
  calls in the text are constrained to the tools (a grammar: free text, then calls);
- "none": the tools reach the template, the text is the answer.

A call's arguments are JSON text. Text the parser cannot read as calls stays the answer's content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from gateway.errors import bad
from gateway.stops import tag_start
from pdserve.proto import gateway_pb2

PARSERS = ("hermes", "llama3_json", "mistral")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1 may open its JSON calls with it (a special token, often skipped)
MISTRAL_TAG = "[TOOL_CALLS]"  # Mistral opens its array of calls with it (a control token, skipped in the text)
# Parsers whose calls are the whole answer: what opens them (the first text character, or the tag).
OPENERS = {"llama3_json": ("{", PYTHON_TAG), "mistral": ("[", MISTRAL_TAG)}


@dataclass(frozen=True)
class ToolChoice:
    """What a request asks of its tools: mode "none", "auto", "required" or "named" (then `name`);
    `parser` reads "auto"'s calls (PARSERS)."""

    mode: str
    name: str = ""
    parallel: bool = True
    parser: str = "hermes"
    strict: frozenset[str] = frozenset()  # the tools marked strict: "auto" constrains their calls


def parse_tools(body: dict) -> list[gateway_pb2.Tool]:
    """The body's `tools` (OpenAI function tools) as Tool messages; [] when absent."""
    value = body.get("tools")
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad("tools", "must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    tools, names = [], set()
    for i, item in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(item, dict) or item.get("type", "function") != "function":
            raise bad(f"{where}.type", "only function tools are supported: {\"type\": \"function\", ...}")
        fn = item.get("function")
        if not isinstance(fn, dict):
            raise bad(f"{where}.function", "must be an object with a name")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise bad(f"{where}.function.name", f"must be 1-64 letters, digits, _ . or -, got {name!r:.40}")
        if name in names:
            raise bad(f"{where}.function.name", f"{name!r} is given twice")
        names.add(name)
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise bad(f"{where}.function.description", "must be a string")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"{where}.function.parameters", f"must be a JSON schema (an object), got {params!r:.40}")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise bad(f"{where}.function.strict", "must be a boolean")
        tools.append(gateway_pb2.Tool(name=name, description=description,
                                      parameters=json.dumps(params) if params is not None else ""))
    return tools


def parse_choice(body: dict, tools: list[gateway_pb2.Tool], parser: str | None) -> ToolChoice:
    """The body's `tool_choice` (default "auto" with tools, "none" without) against its tools."""
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", f"must be a boolean, got {parallel!r:.40}")
    value = body.get("tool_choice")
    if value is None:
        value = "auto" if tools else "none"
    if isinstance(value, dict):
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if value.get("type") != "function" or not isinstance(name, str):
            raise bad("tool_choice", 'must be "none", "auto", "required" or '
                                      '{"type": "function", "function": {"name": ...}}')
        if name not in {t.name for t in tools}:
            raise bad("tool_choice.function.name", f"{name!r:.64} is not one of the request's tools")
        return ToolChoice("named", name, parallel is not False)
    if value not in ("none", "auto", "required"):
        raise bad("tool_choice", f'must be "none", "auto", "required" or a function, got {value!r:.40}')
    if value != "none" and not tools:
        raise bad("tool_choice", f"{value!r} needs tools")
    if value == "auto" and parser is None:
        raise bad("tool_choice", f'"auto" needs a gateway started with --tool-call-parser ({", ".join(PARSERS)}); '
                                  'ask for "required", a named function or "none", or give no tools')
    strict = frozenset(item["function"]["name"] for item in body.get("tools") or () if item["function"].get("strict"))
    return ToolChoice(value, "", parallel is not False, parser or "hermes", strict if value == "auto" else frozenset())


def guide(choice: ToolChoice, tools: list[gateway_pb2.Tool]) -> gateway_pb2.StructuredOutput | None:
    """The structured output a choice needs: a named function's parameters, for "required" an
    array of calls of the tools, for "auto" with strict tools free text whose calls are calls of
    the tools (a strict tool's arguments its schema's); None for "none" and plain "auto"."""
    schemas = {t.name: json.loads(t.parameters) if t.parameters else {"type": "object"} for t in tools}
    if choice.mode == "named":
        return gateway_pb2.StructuredOutput(json_schema=json.dumps(schemas[choice.name]))
    if choice.mode == "auto" and choice.strict:
        return gateway_pb2.StructuredOutput(grammar=_auto_grammar(choice, {
            n: s if n in choice.strict else {"type": "object"} for n, s in schemas.items()}))
    if choice.mode != "required":
        return None
    call = [{"type": "object", "properties": {"name": {"const": n}, "parameters": s},
             "required": ["name", "parameters"], "additionalProperties": False} for n, s in schemas.items()]
    array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": call}}
    if not choice.parallel:
        array["maxItems"] = 1
    return gateway_pb2.StructuredOutput(json_schema=json.dumps(array))


def _auto_grammar(choice: ToolChoice, schemas: dict[str, dict]) -> str:
    """A Lark grammar (llguidance's) of an "auto" answer in the parser's format: any text, and
    where a call begins (Hermes: its tag; Llama: a "{" that opens the answer) a call of one of the
    tools with arguments its schema allows; one call at most without parallel calls."""
    key = "parameters" if choice.parser == "llama3_json" else "arguments"
    compact = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
    call = json.dumps({"x-guidance": compact, "anyOf": [
        {"type": "object", "properties": {"name": {"const": n}, key: s}, "required": ["name", key],
         "additionalProperties": False} for n, s in schemas.items()]})
    if choice.parser == "llama3_json":
        more = '(";" " "? call)*' if choice.parallel else ""
        return (f'start: TEXT | WS call {more}\nWS: /[ \\t\\n]*/\n'
                f'TEXT: /[ \\t\\n]*([^{{ \\t\\n](.|\\n)*)?/\ncall: %json {call}\n')
    if choice.parser == "mistral":
        more = '("," " "? call)*' if choice.parallel else ""
        return (f'start: TEXT | WS ("{MISTRAL_TAG}" WS)? "[" call {more} "]"\nWS: /[ \\t\\n]*/\n'
                f'TEXT: /[ \\t\\n]*([^\\[ \\t\\n](.|\\n)*)?/\ncall: %json {call}\n')
    many = "*" if choice.parallel else "?"
    # The text after the calls cannot hold the tag: a call is only ever one of the tools'.
    return (f'start: (head call){many} TAIL\nhead[lazy]: TEXT "{HERMES_OPEN}"\n'
            f'call: "\\n"? %json {call} "\\n"? "{HERMES_CLOSE}"\nTEXT: /(.|\\n)*/\n'
            f'TAIL: /(?s:.*)/ & ~/(?s:.*){HERMES_OPEN}(?s:.*)/\n')


def _call(index: int, name: str, arguments: str) -> dict:
    return {"index": index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def read_calls(choice: ToolChoice, text: str) -> tuple[str | None, list[dict]] | None:
    """(content, calls) read from a whole answer's text, or None where it holds no calls (the text
    is then the content). Calls are OpenAI tool_calls items with their `index`."""
    if choice.mode == "named":
        return None, [_call(0, choice.name, text)]
    if choice.mode == "required":
        try:
            items = json.loads(text)
        except ValueError:  # cut short (finish "length"): the text is what there is
            return None
        if not isinstance(items, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                  and "parameters" in c for c in items):
            return None
        return None, [_call(i, c["name"], json.dumps(c["parameters"])) for i, c in enumerate(items)]
    if choice.mode == "auto":
        return {"llama3_json": _llama3_json, "mistral": _mistral}.get(choice.parser, _hermes)(text)
    return None


def _hermes(text: str) -> tuple[str | None, list[dict]] | None:
    """Hermes-format calls: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one or more,
    the last one possibly unclosed (the model stopped); the text before the first is the content."""
    start = text.find(HERMES_OPEN)
    if start < 0:
        return None
    calls = []
    for i, m in enumerate(re.finditer(r"<tool_call>(.*?)(?:</tool_call>|\Z)", text[start:], re.DOTALL)):
        try:
            item = json.loads(m.group(1))
        except ValueError:
            return None
        args = item.get("arguments", {}) if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(args, (dict, str)):
            return None
        calls.append(_call(i, item["name"], args if isinstance(args, str) else json.dumps(args)))
    content = text[:start]
    return (content if content.strip() else None), calls


def _llama3_json(text: str) -> tuple[str | None, list[dict]] | None:
    """Llama 3.1/3.2's JSON calls: the whole answer is {"name": ..., "parameters": {...}} (or
    "arguments"), one or more separated by ";", maybe after <|python_tag|>; anything else is text."""
    rest, calls, decoder = text.strip().removeprefix(PYTHON_TAG), [], json.JSONDecoder()
    while rest:
        try:
            item, end = decoder.raw_decode(rest)
        except ValueError:
            return None
        args = item.get("parameters", item.get("arguments", {})) if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(args, (dict, str)):
            return None
        calls.append(_call(len(calls), item["name"], args if isinstance(args, str) else json.dumps(args)))
        rest = rest[end:].strip().removeprefix(";").strip()
    return (None, calls) if calls else None


def _mistral(text: str) -> tuple[str | None, list[dict]] | None:
    """Mistral's calls: the whole answer is a JSON array of {"name": ..., "arguments": {...}},
    maybe after [TOOL_CALLS]; anything else is text."""
    try:
        items = json.loads(text.strip().removeprefix(MISTRAL_TAG))
    except ValueError:
        return None
    calls = []
    for item in items if isinstance(items, list) else [None]:
        args = item.get("arguments", {}) if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(args, (dict, str)):
            return None
        calls.append(_call(len(calls), item["name"], args if isinstance(args, str) else json.dumps(args)))
    return (None, calls) if calls else None


def _call_start(choice: ToolChoice, held: str, sent: str) -> tuple[int, bool]:
    """Streaming "auto": (how much of the held text may go out as content, whether a call has
    begun at that point). Hermes calls begin at their tag anywhere (a partial tag at the end
    waits); Llama's and Mistral's calls only as the whole answer, so its start waits for a first
    character (or the whole tag)."""
    if choice.parser in OPENERS:
        if sent:
            return len(held), False
        start, (first, tag) = held.lstrip(), OPENERS[choice.parser]
        if not start or tag.startswith(start):
            return 0, False
        calling = start.startswith((first, tag))
        return (0 if calling else len(held)), calling
    at = held.find(HERMES_OPEN)
    return (at, True) if at >= 0 else (len(held) - tag_start(held, HERMES_OPEN), False)


class ToolStream:
    """One choice's streamed answer under a tool choice: `feed` each chunk's text and send the
    deltas it returns; `close` at the end gives the last deltas and the finish reason.

    A named function's arguments stream as they come. "required" holds the text back and sends
    its calls at the end. "auto" sends content until a call may begin (text that could be the
    start of the parser's opening tag waits), then holds the rest: its calls go at the end, or,
    where they cannot be read, the held text as content."""

    def __init__(self, choice: ToolChoice) -> None:
        self.choice = choice
        self.held = ""   # text not sent yet
        self.sent = ""   # content sent so far
        self.started = False  # a named function's call delta went out
        self.calling = False  # "auto": the opening tag came; the rest is held

    def feed(self, text: str) -> list[dict]:
        if self.choice.mode == "named":
            if not text and self.started:
                return []
            if not self.started:
                self.started = True
                return [{"tool_calls": [_call(0, self.choice.name, text)]}]
            return [{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}]
        self.held += text
        if self.choice.mode != "auto" or self.calling:
            return []
        cut, self.calling = _call_start(self.choice, self.held, self.sent)
        out, self.held = self.held[:cut], self.held[cut:]
        self.sent += out
        return [{"content": out}] if out else []

    def close(self, finish: str | None) -> tuple[list[dict], str | None]:
        if self.choice.mode == "named":
            return ([] if self.started else self.feed("")), finish
        read = read_calls(self.choice, self.sent + self.held)
        if read is None:
            return ([{"content": self.held}] if self.held else []), finish
        return [{"tool_calls": [c]} for c in read[1]], "tool_calls" if finish == "stop" else finish


def message(choice: ToolChoice, text: str, finish: str | None) -> tuple[dict, str | None]:
    """A whole answer's chat message and finish reason under a tool choice."""
    read = read_calls(choice, text) if choice.mode != "none" else None
    if read is None:
        return {"role": "assistant", "content": text}, finish
    content, calls = read
    for c in calls:
        del c["index"]
    if choice.mode != "named" and finish == "stop":
        finish = "tool_calls"
    return {"role": "assistant", "content": content, "tool_calls": calls}, finish
