"""vLLM's /tokenize and /detokenize on the HTTP face: count a prompt's tokens as the gateway
would send them (a text, or chat messages through the chat template with their tools), or turn
token ids back into text. Errors are GatewayError(INVALID_ARGUMENT) naming the body's parameter."""

from __future__ import annotations

from typing import Any

from gateway import openai_schema as schema
from gateway.errors import invalid
from gateway.generation import Generation
from pdserve.core.sampling import ValidationError


# What a chat body gives /tokenize (its sampling and tool_choice do not change the prompt).
CHAT_OPTIONS = ("messages", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise schema.bad(name, f"must be a boolean, got {value!r:.40}")
    return value


def tokenize(body: dict, generation: Generation, words: schema.TokenText) -> dict[str, Any]:
    """{"prompt": text} (add_special_tokens, default true) or {"messages": [...]} (with `tools`,
    chat_template_kwargs, add_generation_prompt (default true) and continue_final_message, as on chat) -> {"count", "max_model_len", "tokens"} and, with
    return_token_strs, each token's text ("token_strs", as logprobs write tokens)."""
    strs = _flag(body, "return_token_strs", False)
    tok = generation.tokenizer
    try:
        generation.check_model(schema.model_name(body))
        if ("prompt" in body) == ("messages" in body):
            raise schema.bad("prompt", "give one of prompt (a text) or messages")
        if "prompt" in body:
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise schema.bad("prompt", f"must be a string, got {type(prompt).__name__}")
            ids = tok.encode(prompt, add_special_tokens=_flag(body, "add_special_tokens", True))
        else:
            chat = {k: body[k] for k in CHAT_OPTIONS if k in body}
            ids = generation.encode_chat(schema.chat_request({**chat, "tool_choice": "none"}).chat)
    except ValidationError as e:
        raise invalid(e) from None
    out: dict[str, Any] = {"count": len(ids), "max_model_len": generation.model.max_model_len, "tokens": ids}
    if strs:
        out["token_strs"] = [words.string(t) for t in ids]
    return out


def detokenize(body: dict, generation: Generation) -> dict[str, str]:
    """{"tokens": [ids]} -> {"prompt": their text} (special tokens' text included, as vLLM)."""
    try:
        generation.check_model(schema.model_name(body))
    except ValidationError as e:
        raise invalid(e) from None
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise schema.bad("tokens", "must be a list of token ids")
    bad = next((t for t in ids if not 0 <= t < generation.model.vocab_size), None)
    if bad is not None:
        raise schema.bad("tokens", f"token id {bad} is outside the vocabulary (0..{generation.model.vocab_size - 1})")
    return {"prompt": generation.tokenizer.decode(ids)}
