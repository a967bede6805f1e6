"""Speculative decoding, the scheduler side (pure Python): config, n-gram proposer, back-off.

`--speculative-config '{"method":"ngram","num_speculative_tokens":K,"prompt_lookup_max":4,
"prompt_lookup_min":1}'`: each decode step, a sequence whose last n tokens (max..min) occurred
earlier in its prompt or output proposes the K tokens that followed that occurrence; the runner
verifies them in one forward (runtime/spec_verify.py). A sequence whose drafts keep missing
stops proposing for a while, doubling the pause each time, so text the lookup cannot predict
costs (almost) nothing. A verify step also costs the batch's sequences that drafted nothing,
so the whole batch stops drafting too while recent verify steps were mostly rejected or cost
more per token than plain steps (core/spec_gate.BatchGate).

`{"model": DIR, "num_speculative_tokens": K}` (method "draft_model"): a smaller model with the
same tokenizer proposes K tokens greedily for every running sequence (runtime/draft_model.py);
a greedy proposal is a one-hot draft distribution, so the same verification keeps sampling
exact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_MAX_CANDIDATES = 64  # most recent occurrences of the last token examined per proposal
_MAX_DRAFTS = 32
_FLAG = "--speculative-config"
_METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Parsed --speculative-config (ValueError on a bad or unsupported one)."""

    method: str = "ngram"  # or "draft_model": greedy drafts from `model` (the same tokenizer)
    num_speculative_tokens: int = 4
    model: str = ""  # draft_model: the draft model's folder (config.json + safetensors)
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    max_misses: int = 2  # consecutive all-rejected proposals before pausing
    max_pause: int = 64  # steps; the pause doubles from 1 up to this

    @classmethod
    def parse(cls, text: str | dict[str, Any] | None) -> SpeculativeConfig | None:
        """JSON (or a dict) -> config; None/empty means no speculation.

        ValueError naming the offending key for malformed JSON, unknown keys and bad values.
        """
        if not text:
            return None
        if isinstance(text, str):
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{_FLAG}: not valid JSON ({e})") from None
        else:
            d = text
        if not isinstance(d, dict):
            raise ValueError(f"{_FLAG}: must be a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{_FLAG}: unknown key {unknown[0]!r} (known: {sorted(cls.__dataclass_fields__)})")
        if "model" in d and "method" not in d:  # as in vLLM: a model names a draft model
            d = {**d, "method": "draft_model"}
        for key, value in d.items():
            want = str if key in ("method", "model") else int
            if not isinstance(value, want) or isinstance(value, bool):
                raise ValueError(f"{_FLAG}: {key} must be {'a string' if want is str else 'an integer'}, "
                                 f"got {value!r}")
        lookup = {"prompt_lookup_min", "prompt_lookup_max"}
        if len(lookup & set(d)) == 1:  # as in vLLM, one of the two sets both
            d = {**d, **dict.fromkeys(lookup, d[(lookup & set(d)).pop()])}
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """ValueError naming the first bad key."""
        if self.method not in _METHODS:
            raise ValueError(f"{_FLAG}: method {self.method!r} is not supported (one of {list(_METHODS)})")
        if self.method == "draft_model" and not self.model:
            raise ValueError(f"{_FLAG}: method 'draft_model' needs model (the draft model's folder)")
        if self.method != "draft_model" and self.model:
            raise ValueError(f"{_FLAG}: model is for method 'draft_model', not {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= _MAX_DRAFTS:
            raise ValueError(f"{_FLAG}: num_speculative_tokens must be in [1, {_MAX_DRAFTS}], "
                             f"got {self.num_speculative_tokens}")
        if self.prompt_lookup_min < 1:
            raise ValueError(f"{_FLAG}: prompt_lookup_min must be >= 1, got {self.prompt_lookup_min}")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(f"{_FLAG}: prompt_lookup_max ({self.prompt_lookup_max}) must be >= "
                             f"prompt_lookup_min ({self.prompt_lookup_min})")
        if self.max_misses < 1:
            raise ValueError(f"{_FLAG}: max_misses must be >= 1, got {self.max_misses}")
        if self.max_pause < 0:
            raise ValueError(f"{_FLAG}: max_pause must be >= 0, got {self.max_pause}")


@dataclass
class SpecStats:
    """Acceptance counters of one worker (exported as metrics, named as vLLM's)."""

    steps: int = 0  # sequence-steps that verified at least one draft token (vLLM: num_drafts)
    proposed: int = 0  # draft tokens verified
    accepted: int = 0
    emitted: int = 0  # tokens produced by verify steps (accepted + one per step)
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: drafts accepted at offset i

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def record(self, proposed: int, accepted: int) -> None:
        if proposed:
            self.steps += 1
            self.proposed += proposed
            self.accepted += accepted
            self.emitted += accepted + 1
            if len(self.accepted_per_pos) < proposed:
                self.accepted_per_pos.extend([0] * (proposed - len(self.accepted_per_pos)))
            for i in range(accepted):
                self.accepted_per_pos[i] += 1


@dataclass
class NgramProposer:
    """Prompt-lookup proposer of one sequence, with an incremental token -> positions index."""

    cfg: SpeculativeConfig
    tokens: list[int] = field(default_factory=list)
    _where: dict[int, list[int]] = field(default_factory=dict)
    _misses: int = 0
    _pause: int = 0
    _next_pause: int = 1

    def extend(self, new_tokens: list[int] | tuple[int, ...]) -> None:
        """Append tokens (the prompt first, then every emitted token)."""
        for t in new_tokens:
            self._where.setdefault(t, []).append(len(self.tokens))
            self.tokens.append(t)

    def propose(self, limit: int | None = None) -> list[int]:
        """Up to min(K, limit) draft tokens continuing the sequence ([] when paused or no match)."""
        k = self.cfg.num_speculative_tokens if limit is None else min(limit, self.cfg.num_speculative_tokens)
        if self._pause > 0:
            self._pause -= 1
            return []
        if k <= 0 or len(self.tokens) < 2:
            return []
        start = self._match()
        return self.tokens[start : start + k] if start is not None else []

    def _match(self) -> int | None:
        """Index following the most recent earlier occurrence of the longest suffix n-gram."""
        toks, n_max, n_min = self.tokens, self.cfg.prompt_lookup_max, self.cfg.prompt_lookup_min
        last = len(toks) - 1
        best_len, best_end = 0, -1
        for end in reversed(self._where.get(toks[last], [])[-_MAX_CANDIDATES - 1 :]):
            if end == last:
                continue
            n = 1
            while n < n_max and end - n >= 0 and toks[end - n] == toks[last - n]:
                n += 1
            if n > best_len:
                best_len, best_end = n, end
                if n == n_max:
                    break
        return best_end + 1 if best_len >= n_min else None

    def feedback(self, proposed: int, accepted: int) -> None:
        """Record a verify result; repeated misses pause proposing (exponential back-off)."""
        if proposed == 0:
            return
        if accepted > 0:
            self._misses, self._next_pause = 0, 1
            return
        self._misses += 1
        if self._misses >= self.cfg.max_misses:
            self._pause, self._misses = self._next_pause, 0
            self._next_pause = min(self._next_pause * 2, self.cfg.max_pause)
