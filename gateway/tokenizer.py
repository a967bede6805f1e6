"""Prompt tokenization for the gateway: text, chat messages or raw token ids -> token ids."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.hf_tokenizer import Tokenizer
from pdserve.core.sampling import ValidationError

ALLOWED_ROLES = frozenset({"system", "user", "assistant", "tool"})


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """Load the tokenizer (and its chat template) from a local model folder's tokenizer.json; never the hub."""
    return Tokenizer.from_dir(model_dir)


def encode_prompt(
    tok: Tokenizer,
    *,
    text: str | None = None,
    messages: Iterable[Any] | None = None,
    token_ids: Iterable[int] | None = None,
    tools: Iterable[Any] = (),
    add_generation_prompt: bool = True,
) -> list[int]:
    """Turn exactly one kind of prompt into token ids.

    - `text`: encoded as is, with the tokenizer's own special tokens (e.g. BOS) added.
    - `messages`: (role, content) pairs (tuples, mappings with role/content keys, or objects
      with role/content attributes), rendered with the chat template and
      `add_generation_prompt=True`; the template supplies all special tokens. A mapping or
      object may also carry `tool_calls` (items with id, name and arguments, JSON text),
      `tool_call_id` and `name`; `tools` (items with name, description and parameters, a JSON
      schema's text) reach the template as `tools` in the OpenAI form; `add_generation_prompt`
      False leaves out the opening of the assistant's turn (to count a conversation's tokens).
    - `token_ids`: taken as given (range checks against the vocabulary happen in
      `pdserve.core.sampling.validate_prompt`).

    Raises ValidationError naming the bad field.
    """
    given = [name for name, v in (("text", text), ("messages", messages), ("token_ids", token_ids)) if v is not None]
    if len(given) != 1:
        raise ValidationError(
            "prompt", f"give exactly one of text, messages or token_ids (got {', '.join(given) or 'none'})"
        )
    if text is not None:
        return _encode_text(tok, text)
    if messages is not None:
        return _encode_messages(tok, messages, tools, add_generation_prompt)
    assert token_ids is not None
    return _check_token_ids(token_ids)


def _encode_text(tok: Tokenizer, text: str) -> list[int]:
    if not isinstance(text, str):
        raise ValidationError("prompt", f"must be a string, got {type(text).__name__}")
    if text == "":
        raise ValidationError("prompt", "the prompt is empty")
    return tok.encode(text, add_special_tokens=True)


def _encode_messages(tok: Tokenizer, messages: Iterable[Any], tools: Iterable[Any] = (),
                     add_generation_prompt: bool = True) -> list[int]:
    if not _is_list_like(messages):
        raise ValidationError("messages", "must be a list of (role, content) messages")
    items = list(messages)
    if len(items) == 0:
        raise ValidationError("prompt", "the prompt is empty (no messages)")
    if not tok.chat_template:
        raise ValidationError("messages", "this model has no chat template; send a text prompt instead")
    conversation = [_message(i, m) for i, m in enumerate(items)]
    functions = [_tool(i, t) for i, t in enumerate(tools)]
    try:
        rendered = tok.render_chat(conversation, tools=functions or None, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # jinja TemplateError or a template's raise_exception()
        raise ValidationError("messages", f"the chat template rejected the messages: {e}") from e
    # The rendered template already holds BOS/role markers; adding them again would double them.
    return tok.encode(rendered, add_special_tokens=False)


def _message(i: int, message: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
        extra = {k: message[k] for k in ("tool_calls", "tool_call_id", "name") if message.get(k)}
    elif isinstance(message, Sequence) and not isinstance(message, (str, bytes)):
        if len(message) != 2:
            raise ValidationError(f"messages[{i}]", "must be a (role, content) pair")
        role, content = message
    elif hasattr(message, "role") and hasattr(message, "content"):
        role, content = message.role, message.content
        extra = {k: getattr(message, k) for k in ("tool_calls", "tool_call_id", "name") if getattr(message, k, None)}
    else:
        raise ValidationError(f"messages[{i}]", "must be a (role, content) pair")
    if role not in ALLOWED_ROLES:
        raise ValidationError(
            f"messages[{i}].role", f"must be one of {', '.join(sorted(ALLOWED_ROLES))}, got {role!r}"
        )
    if not isinstance(content, str):
        raise ValidationError(f"messages[{i}].content", f"must be a string, got {type(content).__name__}")
    out: dict[str, Any] = {"role": role, "content": content, **extra}
    if "tool_calls" in extra:  # templates read function.arguments as an object, as transformers documents
        out["tool_calls"] = [{"id": _field(c, "id"), "type": "function", "function": {
            "name": _field(c, "name"), "arguments": _json_object(
                _field(c, "arguments") or "{}", f"messages[{i}].tool_calls[{j}].arguments")}}
            for j, c in enumerate(extra["tool_calls"])]
    return out


def _tool(i: int, tool: Any) -> dict[str, Any]:
    """A Tool (name, description, parameters as JSON text) as the OpenAI `tools` item templates read."""
    name = _field(tool, "name")
    if not isinstance(name, str) or not name:
        raise ValidationError(f"tools[{i}].name", "must be a non-empty string")
    function: dict[str, Any] = {"name": name}
    if _field(tool, "description"):
        function["description"] = _field(tool, "description")
    if _field(tool, "parameters"):
        function["parameters"] = _json_object(_field(tool, "parameters"), f"tools[{i}].parameters")
    return {"type": "function", "function": function}


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _json_object(text: Any, field: str) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError as e:
        raise ValidationError(field, f"is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValidationError(field, f"must be the JSON text of an object, got {text!r:.40}")
    return value


def _check_token_ids(token_ids: Iterable[int]) -> list[int]:
    if not _is_list_like(token_ids):
        raise ValidationError("prompt_token_ids", "must be a list of integers")
    ids = list(token_ids)
    if len(ids) == 0:
        raise ValidationError("prompt", "the prompt is empty (no token ids)")
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int)), None)
    if bad is not None:
        raise ValidationError("prompt_token_ids", f"must be integers, got {bad!r}")
    return ids


def _is_list_like(value: Any) -> bool:
    # Protobuf repeated fields are iterable but not always registered as Sequence.
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))
