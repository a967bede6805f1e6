"""Prompt tokenization for the gateway: text, chat messages or raw token ids -> token ids."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from pdserve.core.sampling import ValidationError

ALLOWED_ROLES = frozenset({"system", "user", "assistant", "tool"})


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer (and its chat template) from a local model folder; never the hub."""
    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def encode_prompt(
    tok: PreTrainedTokenizerBase,
    *,
    text: str | None = None,
    messages: Iterable[Any] | None = None,
    token_ids: Iterable[int] | None = None,
) -> list[int]:
    """Turn exactly one kind of prompt into token ids.

    - `text`: encoded as is, with the tokenizer's own special tokens (e.g. BOS) added.
    - `messages`: (role, content) pairs (tuples, mappings with role/content keys, or objects
      with role/content attributes), rendered with the chat template and
      `add_generation_prompt=True`; the template supplies all special tokens.
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
        return _encode_messages(tok, messages)
    assert token_ids is not None
    return _check_token_ids(token_ids)


def _encode_text(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    if not isinstance(text, str):
        raise ValidationError("prompt", f"must be a string, got {type(text).__name__}")
    if text == "":
        raise ValidationError("prompt", "the prompt is empty")
    return list(tok(text, add_special_tokens=True)["input_ids"])


def _encode_messages(tok: PreTrainedTokenizerBase, messages: Iterable[Any]) -> list[int]:
    if not _is_list_like(messages):
        raise ValidationError("messages", "must be a list of (role, content) messages")
    items = list(messages)
    if len(items) == 0:
        raise ValidationError("prompt", "the prompt is empty (no messages)")
    if not tok.chat_template:
        raise ValidationError("messages", "this model has no chat template; send a text prompt instead")
    conversation = [_message(i, m) for i, m in enumerate(items)]
    try:
        rendered = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # jinja TemplateError or a template's raise_exception()
        raise ValidationError("messages", f"the chat template rejected the messages: {e}") from e
    assert isinstance(rendered, str)
    # The rendered template already holds BOS/role markers; adding them again would double them.
    return list(tok(rendered, add_special_tokens=False)["input_ids"])


def _message(i: int, message: Any) -> dict[str, str]:
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
    elif isinstance(message, Sequence) and not isinstance(message, (str, bytes)):
        if len(message) != 2:
            raise ValidationError(f"messages[{i}]", "must be a (role, content) pair")
        role, content = message
    elif hasattr(message, "role") and hasattr(message, "content"):
        role, content = message.role, message.content
    else:
        raise ValidationError(f"messages[{i}]", "must be a (role, content) pair")
    if role not in ALLOWED_ROLES:
        raise ValidationError(
            f"messages[{i}].role", f"must be one of {', '.join(sorted(ALLOWED_ROLES))}, got {role!r}"
        )
    if not isinstance(content, str):
        raise ValidationError(f"messages[{i}].content", f"must be a string, got {type(content).__name__}")
    return {"role": role, "content": content}


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
