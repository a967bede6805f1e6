"""OpenAI's Responses API (POST /v1/responses) over the chat path.

A Responses body becomes a chat body (`to_chat`): `instructions` a system message, `input` the
messages (a string, or message items with text parts, earlier `function_call` items and their
`function_call_output`s), `max_output_tokens` max_tokens, `text.format` response_format, the
function tools and tool_choice in chat's shape; the vLLM extras chat takes pass through. Errors
from the chat path name the Responses parameter (`Names`). The answer, streamed or not, comes
from the same deltas as a streamed chat answer (chat_answer.ChatDeltas): `Builder` turns them
into output items (reasoning, message, function_call) and, when streaming, into the API's
events. Nothing is stored: `previous_response_id` and `background` are refused by name, `store`
is accepted and has no effect.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from gateway.chat_answer import ChatDeltas
from gateway.errors import GatewayError, bad
from gateway.openai_schema import FINISH_NAMES, openai_param

# Chat parameters a Responses body may carry as they are (vLLM's extras included).
PASSED = ("model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
          "frequency_penalty", "seed", "stop", "logit_bias", "priority", "parallel_tool_calls",
          "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "include_reasoning",
          "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
REFUSED = ("previous_response_id", "conversation", "prompt", "top_logprobs")
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


class Names:
    """Chat parameter names back to the Responses body's: messages[k] -> input[j] (or
    instructions), max_tokens -> max_output_tokens, response_format -> text.format, ..."""

    def __init__(self) -> None:
        self.messages: list[str] = []  # chat message k came from this Responses parameter

    def param(self, field: str | None) -> str | None:
        if field is None:
            return None
        m = re.match(r"messages\[(\d+)\]", field)
        if m and int(m.group(1)) < len(self.messages):
            return self.messages[int(m.group(1))] + field[m.end():]
        m = re.match(r"tools\[(\d+)\]\.function", field)
        if m:
            return f"tools[{m.group(1)}]" + field[m.end():]
        for chat, ours in (("max_tokens", "max_output_tokens"), ("response_format.json_schema", "text.format"),
                           ("response_format", "text.format"),
                           ("tool_choice.function.name", "tool_choice.name"), ("messages", "input")):
            if field == chat or field.startswith(chat + "."):
                return ours + field[len(chat):]
        return field

    def renamed(self, e: GatewayError) -> GatewayError:
        """e naming the Responses parameter (its message starts with the new name)."""
        chat = openai_param(e.field)
        ours = self.param(chat)
        if ours == chat or chat is None:
            return e
        tail = e.message[len(e.field):] if e.field and e.message.startswith(e.field + ":") else f": {e.message}"
        return GatewayError(e.code, ours + tail, e.retry_after_ms, ours)


def to_chat(body: dict) -> tuple[dict, Names]:
    """The chat body for a Responses body, and how to name its parameters back."""
    for name in REFUSED:
        if body.get(name) not in (None, 0):
            raise bad(name, "is not supported by this server (it keeps no responses or conversations)")
    if body.get("background") not in (None, False):
        raise bad("background", "is not supported by this server")
    names = Names()
    chat: dict[str, Any] = {k: body[k] for k in PASSED if k in body}
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions", f"must be a string, got {instructions!r:.40}")
        messages.append({"role": "system", "content": instructions})
        names.messages.append("instructions")
    _input(body.get("input"), messages, names)
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat, names


def _input(value: Any, messages: list[dict], names: Names) -> None:
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
        names.messages.append("input")
        return
    if not isinstance(value, list) or not value:
        raise bad("input", "must be a string or a non-empty list of input items")
    for j, item in enumerate(value):
        where = f"input[{j}]"
        if not isinstance(item, dict):
            raise bad(where, "must be an object (a message or a function_call / function_call_output item)")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r:.40}")
            messages.append({"role": ROLES[role], "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise bad(f"{where}.{key}", "must be a string")
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
                continue
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or not isinstance(output, str):
                raise bad(where, "must have a string call_id and a string output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            continue  # an earlier turn's reasoning: chat templates leave it out
        else:
            raise bad(f"{where}.type", f"{kind!r:.40} is not supported (message, function_call, "
                                       "function_call_output or reasoning)")
        names.messages.append(where)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad(where, "must be a string or a list of input_text parts (only text is supported)")


def _format(text: Any) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad("text", 'must be an object like {"format": {"type": "json_schema", ...}}')
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        raise bad("text.format.type", f"must be text, json_object or json_schema, got {fmt!r:.60}")
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


def _tools(value: Any) -> list:
    if not isinstance(value, list):
        raise bad("tools", 'must be a list of {"type": "function", "name": ...} tools')
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise bad(f"tools[{i}].type", f"only function tools are supported, got {kind!r:.40}")
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _tool_choice(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    return value


class Builder:
    """The output items of one answer from its chat deltas, and (streaming) the API's events.
    `add` takes a delta and returns the events it makes; `finish` the last ones."""

    def __init__(self, response: dict) -> None:
        self.response = response  # the frame: id, model, the request's settings
        self.output: list[dict] = []
        self.open: dict | None = None  # the item being written
        self.calls: dict[int, dict] = {}  # a tool call's index -> its item
        self.seq = 0

    def event(self, kind: str, **fields: Any) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def start(self) -> list[dict]:
        snapshot = {**self.response, "status": "in_progress", "output": []}
        return [self.event("response.created", response=snapshot), self.event("response.in_progress", response=snapshot)]

    def add(self, delta: dict) -> list[dict]:
        if delta.get("reasoning"):
            return self._text("reasoning", delta["reasoning"])
        if delta.get("content"):
            return self._text("message", delta["content"])
        out: list[dict] = []
        for call in delta.get("tool_calls", []):
            fn = call.get("function", {})
            item = self.calls.get(call["index"])
            if item is None:
                out += self._close()
                item = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:24], "call_id": call.get("id", ""),
                        "name": fn.get("name", ""), "arguments": "", "status": "in_progress"}
                self.calls[call["index"]] = item
                out += self._opened(item)
            if fn.get("arguments"):
                item["arguments"] += fn["arguments"]
                out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self.output.index(item), delta=fn["arguments"]))
        return out

    def finish(self, finish: str | None, usage: dict) -> tuple[dict, list[dict]]:
        """The whole response and the events that end the stream."""
        out = self._close()
        incomplete = finish == "length"
        self.response.update(status="incomplete" if incomplete else "completed", output=self.output, usage=usage,
                             incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
                             completed_at=None if incomplete else time.time())
        out.append(self.event("response.incomplete" if incomplete else "response.completed", response=self.response))
        return self.response, out

    def _text(self, kind: str, text: str) -> list[dict]:
        out: list[dict] = []
        if self.open is None or self.open["type"] != kind:
            out += self._close()
            if kind == "reasoning":
                item = {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex[:24], "summary": [],
                        "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
            else:
                item = {"type": "message", "id": "msg_" + uuid.uuid4().hex[:24], "role": "assistant",
                        "status": "in_progress", "content": [{"type": "output_text", "text": "", "annotations": []}]}
            out += self._opened(item)
            self.open = item
        item = self.open
        item["content"][0]["text"] += text
        kind_name = "reasoning_text" if kind == "reasoning" else "output_text"
        out.append(self.event(f"response.{kind_name}.delta", item_id=item["id"], output_index=len(self.output) - 1,
                              content_index=0, delta=text, **({} if kind == "reasoning" else {"logprobs": []})))
        return out

    def _opened(self, item: dict) -> list[dict]:
        self.output.append(item)
        index = len(self.output) - 1
        shown = {**item, "content": []} if "content" in item else dict(item)
        out = [self.event("response.output_item.added", output_index=index, item=shown)]
        if item["type"] == "message":
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                  content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def _close(self) -> list[dict]:
        """The events that end the items still open (a text item, or the tool calls)."""
        out: list[dict] = []
        for item in self.output:
            if item["status"] != "in_progress":
                continue
            item["status"] = "completed"
            index = self.output.index(item)
            if item["type"] == "function_call":
                out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, arguments=item["arguments"]))
            else:
                part = item["content"][0]
                name = "reasoning_text" if item["type"] == "reasoning" else "output_text"
                out.append(self.event(f"response.{name}.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=part["text"],
                                      **({} if item["type"] == "reasoning" else {"logprobs": []})))
                if item["type"] == "message":
                    out.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                          content_index=0, part=part))
            out.append(self.event("response.output_item.done", output_index=index, item=item))
        self.open = None
        return out


def frame(rid: str, model: str, body: dict, chat: dict) -> dict:
    """The response object's fields that come from the request."""
    return {"id": "resp_" + rid, "object": "response", "created_at": time.time(), "model": model,
            "status": "in_progress", "output": [], "error": None, "incomplete_details": None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto" if body.get("tools") else "none"),
            "tools": body.get("tools") or [], "text": body.get("text") or {"format": {"type": "text"}},
            "metadata": body.get("metadata"), "store": False, "background": False}


def usage(prompt: int, completion: int, reasoning: int) -> dict:
    """Responses usage; cached_tokens is 0: the gateway does not learn prefix-cache hits."""
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": prompt + completion}


async def answer(builder: Builder, deltas: ChatDeltas, messages: AsyncIterator[Any],
                 write: Callable[[dict], Awaitable[None]] | None) -> dict:
    """Run one answer's GenerateResponse messages through `deltas` into the builder; with `write`,
    each event goes out as it is made. Returns the whole response. Its reasoning_tokens count the
    tokens of the chunks after which the answer was still inside its reasoning."""
    reasoning_tokens = 0
    for e in builder.start() if write is not None else ():
        await write(e)
    async for msg in messages:
        if msg.HasField("chunk"):
            events = [e for d in deltas.feed(msg.chunk.text) for e in builder.add(d)]
            if deltas.thinking is not None and deltas.thinking.state == "thinking":
                reasoning_tokens += len(msg.chunk.token_ids)
        else:
            last, finish = deltas.close(FINISH_NAMES.get(msg.complete.finish_reason))
            events = [e for d in last for e in builder.add(d)]
            u = msg.complete.usage
            response, end = builder.finish(finish, usage(u.prompt_tokens, u.completion_tokens, reasoning_tokens))
            events += end
        for e in events if write is not None else ():
            await write(e)
        if msg.HasField("complete"):
            return response
    raise GatewayError(grpc.StatusCode.INTERNAL, "a generation ended without its final message")
