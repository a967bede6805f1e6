"""Sampling parameters and their validation (pure Python)."""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass

MAX_LOGPROBS = 20  # most alternatives a token's logprobs may list (vLLM's default cap, OpenAI chat's)
MAX_LOGIT_BIAS = 1024  # most biased tokens per request (each step uploads them again)
MAX_GUIDE_CHARS = 64 << 10  # longest schema, regex, choice list or grammar a request may carry


class ValidationError(ValueError):
    """A request field is invalid; `field` names it (mapped to INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


REASONING_MODES = ("", "open", "optional")  # Guide.reasoning


class GuideKind(enum.Enum):
    JSON = "json"  # value: a JSON schema (JSON text)
    REGEX = "regex"  # value: a regular expression the whole output matches
    CHOICE = "choice"  # value: a JSON array of strings, the output being one of them
    GRAMMAR = "grammar"  # value: a Lark grammar (llguidance's dialect)


@dataclass(frozen=True)
class Guide:
    """What the generated text must spell (structured output): the worker turns it into a
    grammar and masks, at every sampled position, the tokens that would leave its language."""

    kind: GuideKind
    value: str
    # Thinking models: "open" (the output starts inside a <think>: any text up to "</think>" and
    # whitespace come before the language), "optional" (it may start with "<think>...</think>"),
    # "" (the language from the first token)
    reasoning: str = ""

    def validate(self) -> None:
        """The checks that need no tokenizer (pdserve.guided compiles the rest); ValidationError."""
        if self.reasoning not in REASONING_MODES:
            raise ValidationError("guide", f"reasoning must be one of {', '.join(map(repr, REASONING_MODES))}, "
                                  f"got {self.reasoning!r:.40}")
        if not self.value:
            raise ValidationError("guide", f"the {self.kind.value} is empty")
        if len(self.value) > MAX_GUIDE_CHARS:
            raise ValidationError("guide", f"the {self.kind.value} has {len(self.value)} characters, "
                                  f"at most {MAX_GUIDE_CHARS}")
        if self.kind is GuideKind.JSON:
            try:
                schema = json.loads(self.value)
            except ValueError as e:
                raise ValidationError("guide", f"the JSON schema does not parse: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValidationError("guide", "the JSON schema must be an object")
        elif self.kind is GuideKind.CHOICE:
            try:
                choices = json.loads(self.value)
            except ValueError as e:
                raise ValidationError("guide", f"the choices do not parse as a JSON array: {e}") from None
            if not (isinstance(choices, list) and choices and all(isinstance(c, str) and c for c in choices)):
                raise ValidationError("guide", "the choices must be a non-empty list of non-empty strings")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # None: no logprobs; n >= 0: each token's log-probability and the n most likely tokens'
    logprobs: int | None = None
    # OpenAI's: logit -= presence * (token generated) + frequency * (times generated)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's / HF's: a token of the prompt or the output has its logit divided by it if > 0, else multiplied
    repetition_penalty: float = 1.0
    # drop tokens less likely than min_p times the most likely one (after temperature)
    min_p: float = 0.0
    # OpenAI's: (token id, bias in [-100, 100]) added to the logits before anything else
    logit_bias: tuple[tuple[int, float], ...] = ()
    # None: none; n >= 0: each prompt token's log-probability given the tokens before it (the
    # first token has none) and the n most likely tokens' there (vLLM's prompt_logprobs)
    prompt_logprobs: int | None = None
    # None: free text; else the output follows it (structured output)
    guide: Guide | None = None
    # Scheduling, not sampling (it travels with the request's parameters): a worker serves the
    # lowest first and preempts the highest first; ties first come, first served (vLLM's priority)
    priority: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether sampling depends on the tokens so far (a slice then carries them: SeqSlice.history)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValidationError naming the first bad field (token ids checked against vocab_size if given)."""
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValidationError("temperature", f"must be a finite number >= 0, got {self.temperature}")
        if not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValidationError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < -1 or self.top_k == 0:
            raise ValidationError("top_k", f"must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens <= 0:
            raise ValidationError("max_tokens", f"must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ValidationError(
                "min_tokens", f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if not -(2**31) <= self.priority < 2**31:
            raise ValidationError("priority", f"must be a 32-bit integer, got {self.priority}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValidationError("seed", f"must be in [0, 2^63), got {self.seed}")
        if any(s == "" for s in self.stop):
            raise ValidationError("stop", "stop strings must not be empty")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValidationError("stop_token_ids", "token ids must be >= 0")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not math.isfinite(v) or not -2.0 <= v <= 2.0:
                raise ValidationError(name, f"must be in [-2, 2], got {v}")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValidationError("repetition_penalty", f"must be a finite number > 0, got {self.repetition_penalty}")
        if not math.isfinite(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValidationError("min_p", f"must be in [0, 1], got {self.min_p}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValidationError("logit_bias", f"at most {MAX_LOGIT_BIAS} tokens, got {len(self.logit_bias)}")
        for token, bias in self.logit_bias:
            if token < 0:
                raise ValidationError("logit_bias", f"token id {token} must be >= 0")
            if vocab_size is not None and token >= vocab_size:
                raise ValidationError("logit_bias", f"token id {token} is outside the vocabulary [0, {vocab_size})")
            if not math.isfinite(bias) or not -100.0 <= bias <= 100.0:
                raise ValidationError("logit_bias", f"the bias of token {token} must be in [-100, 100], got {bias}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= MAX_LOGPROBS:
                raise ValidationError(name, f"must be in [0, {MAX_LOGPROBS}], got {v}")
        if self.guide is not None:
            self.guide.validate()
            if self.min_tokens:  # EOS may be all a complete output allows
                raise ValidationError("min_tokens", "cannot be combined with structured output")


def validate_prompt(
    token_ids: list[int] | tuple[int, ...], max_tokens: int, vocab_size: int, max_model_len: int
) -> None:
    """Checks that hold for any prompt, whichever form it came in."""
    if len(token_ids) == 0:
        raise ValidationError("prompt", "the prompt is empty")
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValidationError("prompt_token_ids", f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    if len(token_ids) >= max_model_len:  # no room for one new token, whatever max_tokens says
        raise ValidationError(
            "prompt", f"the prompt has {len(token_ids)} tokens; max_model_len ({max_model_len}) leaves no room to generate"
        )
    if len(token_ids) + max_tokens > max_model_len:
        raise ValidationError(
            "max_tokens",
            f"prompt ({len(token_ids)} tokens) + max_tokens ({max_tokens}) exceeds "
            f"max_model_len ({max_model_len})",
        )
