"""One request's state inside a worker (pure Python)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import TokenLogprobs


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # needs (re)compute of some tokens before it can decode
    RUNNING = "running"  # KV holds every token but the last: decodes one token per step
    FINISHED = "finished"


class Finish(enum.Enum):
    STOP = "stop"  # EOS or a stop token id
    LENGTH = "length"  # max_tokens or max_model_len
    ABORT = "abort"


class TokenGuide(Protocol):
    """A structured-output request's grammar state (pdserve.guided.LLGuide makes them)."""

    def allowed(self) -> bytes:
        """The tokens that may come next: bit t % 8 of byte t // 8 is set where token t may."""
        ...

    def accept(self, token: int) -> bool:
        """Advance past a generated token; False: it leaves the language (the guide is then
        broken and allows nothing more)."""
        ...


@dataclass(eq=False)
class Sequence:
    """Tokens, cache blocks and progress of one request.

    `num_computed` tokens have their KV in `block_table`; the next step computes from there.
    `prompt_logprobs` gathers the prompt's logprobs (params.prompt_logprobs) chunk by chunk
    until the first output token carries them. `guide` (structured output) has accepted
    every token of `output_ids`.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: tuple[int, ...] = ()
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0  # prompt tokens found in the prefix cache at admission
    status: SeqStatus = SeqStatus.WAITING
    finish: Finish | None = None
    arrival: int = 0
    order: tuple[int, int] = (0, 0)  # (priority, arrival): the scheduler serves the smallest first
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    guide: TokenGuide | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_slice(self, start: int, end: int) -> tuple[int, ...]:
        """token_ids[start:end] without building token_ids (a decode step's one token is cheap)."""
        p = len(self.prompt_ids)
        if start >= p:
            return tuple(self.output_ids[start - p : end - p])
        if end <= p:
            return tuple(self.prompt_ids[start:end])
        return tuple(self.prompt_ids[start:]) + tuple(self.output_ids[: end - p])

    @property
    def owes_prompt_logprobs(self) -> bool:
        """The prompt's logprobs are asked for and not yet delivered (no output token yet)."""
        return self.params.prompt_logprobs is not None and not self.output_ids

    def prompt_targets(self, start: int, end: int) -> tuple[int, ...]:
        """A slice's SeqSlice.prompt_targets: prompt tokens start+1 .. end (at most the last
        prompt token) while the prompt's logprobs are owed."""
        if not self.owes_prompt_logprobs:
            return ()
        return tuple(self.prompt_ids[start + 1 : min(end + 1, len(self.prompt_ids))])

    def suppressed(self, pending: int = 0) -> tuple[int, ...]:
        """Tokens that must not be sampled yet (min_tokens not reached), `pending` outputs
        after the known ones."""
        if len(self.output_ids) + pending >= self.params.min_tokens:
            return ()
        eos = () if self.params.ignore_eos else self.eos_ids
        return tuple(eos) + tuple(self.params.stop_token_ids)


def check_finish(seq: Sequence, max_model_len: int) -> Finish | None:
    """Why seq stops after its latest token, or None (stop strings are the gateway's)."""
    n, p = len(seq.output_ids), seq.params
    if n == 0:
        return None
    last = seq.output_ids[-1]
    if n >= p.min_tokens:
        if (not p.ignore_eos and last in seq.eos_ids) or last in p.stop_token_ids:
            return Finish.STOP
    if n >= p.max_tokens or len(seq) >= max_model_len:
        return Finish.LENGTH
    return None
