"""Prompt logprobs of the single-process engine, and the check of a gateway stream's against them."""

from __future__ import annotations

import pytest

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import SeqSlice, StepInput


def offline_prompt_logprobs(runner, prompt: list[int], k: int) -> list:
    """The single-process engine's prompt logprobs (one prefill of the whole prompt)."""
    params = SamplingParams(temperature=0.0, prompt_logprobs=k)
    sl = SeqSlice("plp", tuple(prompt), 0, tuple(range(-(-len(prompt) // 16))), params,
                  prompt_targets=tuple(prompt[1:]))
    return list(runner.execute(StepInput((sl,))).prompt_logprobs["plp"])


def check_prompt_logprobs(chunks, prompt: list[int], want: list, k: int) -> None:
    """The first chunk carries the prompt's ids and an entry per token after the first, equal
    to the single-process engine's; no later chunk carries any."""
    first, rest = chunks[0], chunks[1:]
    assert list(first.prompt_token_ids) == prompt and len(first.prompt_logprobs) == len(prompt) - 1
    assert not any(c.prompt_logprobs or c.prompt_token_ids for c in rest)
    for lp, w in zip(first.prompt_logprobs, want):
        assert lp.logprob == pytest.approx(w.logprob, abs=1e-4)
        assert lp.rank == w.rank
        assert len(lp.top_token_ids) == k and list(lp.top_token_ids) == [t for t, _ in w.top]
        assert list(lp.top_logprobs) == pytest.approx([v for _, v in w.top], abs=1e-4)
