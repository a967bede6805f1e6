"""Speculative decoding, the scheduler side (pure Python): config, n-gram proposer, back-off.

`--speculative-config '{"method":"ngram","num_speculative_tokens":K,"prompt_lookup_max":4,
"prompt_lookup_min":1}'`: each decode step, a sequence whose last n tokens (max..min) occurred
earlier in its prompt or output proposes the K tokens that followed that occurrence; the runner
verifies them in one forward (runtime/spec_verify.py). A sequence whose drafts keep missing
stops proposing for a while, doubling the pause each time, so text the lookup cannot predict
costs (almost) nothing. The draft-model method is not implemented.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_MAX_CANDIDATES = 64  # most recent occurrences of the last token examined per proposal


@dataclass(frozen=True)
class SpeculativeConfig:
    """Parsed --speculative-config (ValueError on a bad or unsupported one)."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    max_misses: int = 2  # consecutive all-rejected proposals before pausing
    max_pause: int = 64  # steps; the pause doubles from 1 up to this

    @classmethod
    def parse(cls, text: str | dict[str, Any] | None) -> SpeculativeConfig | None:
        """JSON (or a dict) -> config; None/empty means no speculation."""
        if not text:
            return None
        d = json.loads(text) if isinstance(text, str) else dict(text)
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"--speculative-config: unknown keys {sorted(unknown)}")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"--speculative-config: method {self.method!r} unsupported (ngram)")
        if self.num_speculative_tokens < 1:
            raise ValueError("--speculative-config: num_speculative_tokens must be >= 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max")


@dataclass
class SpecStats:
    """Acceptance counters of one worker (exported as metrics)."""

    steps: int = 0  # sequence-steps that verified at least one draft token
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens produced by verify steps (accepted + one per step)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def record(self, proposed: int, accepted: int) -> None:
        if proposed:
            self.steps += 1
            self.proposed += proposed
            self.accepted += accepted
            self.emitted += accepted + 1


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
