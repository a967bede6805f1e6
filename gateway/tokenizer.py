"""Prompt tokenization for the gateway: text, chat messages or raw token ids -> token ids."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.hf_tokenizer import Tokenizer
from pdserve.core.sampling import ValidationError

ALLOWED_ROLES = frozenset({"system", "user", "assistant", "tool"})
# Template variables a request's template_kwargs cannot set: the gateway sets them itself.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message"})


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
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Turn exactly one kind of prompt into token ids.

    - `text`: encoded as is, with the tokenizer's own special tokens (e.g. BOS) added.
    - `messages`: (role, content) pairs (tuples, mappings with role/content keys, or objects
      with role/content attributes), rendered with the chat template and
      `add_generation_prompt=True`; the template supplies all special tokens. A mapping or
      object may also carry `tool_calls` (items with id, name and arguments, JSON text),
      `tool_call_id` and `name`; `tools` (items with name, description and parameters, a JSON
      schema's text) reach the template as `tools` in the OpenAI form; `add_generation_prompt`
      False leaves out the opening of the assistant's turn (to count a conversation's tokens);
      `continue_final_message` (with add_generation_prompt False) ends the prompt right after the
      last message's content, so the answer continues that message; `template_kwargs` are extra
      template variables (see `template_variables`).
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
        return encode_rendered(tok, render_chat(tok, messages, tools, add_generation_prompt=add_generation_prompt,
                                                continue_final_message=continue_final_message,
                                                template_kwargs=template_kwargs))
    assert token_ids is not None
    return _check_token_ids(token_ids)


def _encode_text(tok: Tokenizer, text: str) -> list[int]:
    if not isinstance(text, str):
        raise ValidationError("prompt", f"must be a string, got {type(text).__name__}")
    if text == "":
        raise ValidationError("prompt", "the prompt is empty")
    return tok.encode(text, add_special_tokens=True)


def template_variables(text: str) -> dict[str, Any]:
    """A request's template_kwargs (JSON text of an object; "" for none) as template variables,
    or ValidationError naming `template_kwargs` (not JSON, not an object, or a reserved name)."""
    if not text:
        return {}
    variables = _json_object(text, "template_kwargs")
    taken = sorted(RESERVED_TEMPLATE_VARIABLES & variables.keys())
    if taken:
        raise ValidationError(f"template_kwargs.{taken[0]}", "is set by the request itself, not as a template variable")
    return variables


def encode_rendered(tok: Tokenizer, rendered: str) -> list[int]:
    """A rendered chat's token ids: it already holds BOS and role markers, so none are added."""
    return tok.encode(rendered, add_special_tokens=False)


def render_chat(tok: Tokenizer, messages: Iterable[Any], tools: Iterable[Any] = (), *,
                add_generation_prompt: bool = True, continue_final_message: bool = False,
                template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The chat template's text for messages (see encode_prompt), or ValidationError naming the field."""
    if not _is_list_like(messages):
        raise ValidationError("messages", "must be a list of (role, content) messages")
    items = list(messages)
    if len(items) == 0:
        raise ValidationError("prompt", "the prompt is empty (no messages)")
    if not tok.chat_template:
        raise ValidationError("messages", "this model has no chat template; send a text prompt instead")
    if continue_final_message and add_generation_prompt:
        raise ValidationError("continue_final_message", "needs add_generation_prompt false (the answer continues "
                                                        "the last message instead of opening a turn)")
    conversation = [_message(i, m) for i, m in enumerate(items)]
    functions = [_tool(i, t) for i, t in enumerate(tools)]
    try:
        rendered = tok.render_chat(conversation, tools=functions or None, add_generation_prompt=add_generation_prompt,
                                   **(template_kwargs or {}))
    except Exception as e:  # jinja TemplateError or a template's raise_exception()
        raise ValidationError("messages", f"the chat template rejected the messages: {e}") from e
    return _open_last(rendered, conversation) if continue_final_message else rendered


def _open_last(rendered: str, conversation: list[dict[str, Any]]) -> str:
    """The rendered chat cut right after the last message's content (what closes its turn goes)."""
    where = f"messages[{len(conversation) - 1}].content"
    content = conversation[-1]["content"]
    if not content.strip():
        raise ValidationError(where, "must not be empty with continue_final_message (it is the text to continue)")
    for text in (content, content.strip()):  # a template may strip the content
        at = rendered.rfind(text)
        if at >= 0:
            return rendered[:at + len(text)]
    raise ValidationError(where, "the chat template does not show it as given, so it cannot be continued")


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
