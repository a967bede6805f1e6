"""Benchmark workloads: random lengths, a ShareGPT-like length mix, a shared system prompt.

Prompts are token ids drawn from the vocabulary and sent with ignore_eos, so every request
produces exactly its output_len tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHAREGPT_LIKE = Path(__file__).with_name("data") / "sharegpt_like.json"
DATASETS = ("random", "sharegpt-like", "shared-prefix")


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: prompt token ids and the exact number of tokens to generate."""

    prompt_ids: tuple[int, ...]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


def length_bounds(mean: int, range_ratio: float) -> tuple[int, int]:
    """Inclusive [low, high] of lengths sampled around mean with vLLM's range ratio (lengths >= 1)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range ratio must be in [0, 1), got {range_ratio}")
    return max(1, int(mean * (1 - range_ratio))), max(1, int(mean * (1 + range_ratio)))


def _tokens(rng: np.random.Generator, n: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(0, vocab_size, size=n))


def random_requests(n: int, input_len: int, output_len: int, range_ratio: float,
                    vocab_size: int, seed: int = 0) -> list[BenchRequest]:
    """n requests with lengths uniform in [len*(1-r), len*(1+r)] and random token ids."""
    rng = np.random.default_rng(seed)
    ilo, ihi = length_bounds(input_len, range_ratio)
    olo, ohi = length_bounds(output_len, range_ratio)
    ins = rng.integers(ilo, ihi + 1, size=n)
    outs = rng.integers(olo, ohi + 1, size=n)
    return [BenchRequest(_tokens(rng, int(i), vocab_size), int(o)) for i, o in zip(ins, outs)]


def shared_prefix_requests(n: int, prefix_len: int, input_len: int, output_len: int, range_ratio: float,
                           vocab_size: int, seed: int = 0) -> list[BenchRequest]:
    """A common system prompt of prefix_len tokens followed by a distinct random suffix each."""
    rng = np.random.default_rng(seed + 1)
    prefix = _tokens(rng, prefix_len, vocab_size)
    return [BenchRequest(prefix + r.prompt_ids, r.output_len)
            for r in random_requests(n, input_len, output_len, range_ratio, vocab_size, seed)]


def load_length_pairs(path: Path = SHAREGPT_LIKE) -> list[tuple[int, int]]:
    """The shipped (input_len, output_len) pairs of the synthetic ShareGPT-like mix."""
    data = json.loads(path.read_text())
    return [(int(i), int(o)) for i, o in data["pairs"]]


def sharegpt_like_requests(n: int, vocab_size: int, max_model_len: int | None = None,
                           seed: int = 0) -> list[BenchRequest]:
    """n requests whose lengths are drawn (with a seed) from the shipped ShareGPT-like mix.

    Pairs that do not fit max_model_len are skipped, as vLLM skips over-long ShareGPT pairs.
    """
    pairs = load_length_pairs()
    if max_model_len is not None:
        pairs = [(i, o) for i, o in pairs if i + o <= max_model_len]
    if not pairs:
        raise ValueError("no ShareGPT-like pair fits the model length")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(pairs), size=n, replace=n > len(pairs))
    return [BenchRequest(_tokens(rng, pairs[k][0], vocab_size), pairs[k][1]) for k in picks]


def build(name: str, n: int, *, input_len: int, output_len: int, range_ratio: float, prefix_len: int,
          vocab_size: int, max_model_len: int | None, seed: int) -> list[BenchRequest]:
    """The workload called name (one of DATASETS)."""
    if name == "random":
        return random_requests(n, input_len, output_len, range_ratio, vocab_size, seed)
    if name == "shared-prefix":
        return shared_prefix_requests(n, prefix_len, input_len, output_len, range_ratio, vocab_size, seed)
    if name == "sharegpt-like":
        return sharegpt_like_requests(n, vocab_size, max_model_len, seed)
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
