"""The only contract between a scheduler and a model runner.

A scheduler (pure Python) emits a StepInput; the runner turns it into tensors, runs one
forward pass over the paged cache and returns a StepOutput. Neither side reaches into the
other's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.core.sampling import SamplingParams


PLACEHOLDER = -1  # the token of a slice with prev_row >= 0, sampled by the step before


@dataclass(frozen=True, slots=True, eq=False)
class History:
    """A sequence's first `length` tokens (`prompt` then `output`), read only when needed: a
    runner that keeps counts between steps reads it again only for a request it has not seen
    (the lists are the sequence's own, which only ever grow, so the view stays true)."""

    prompt: list[int]
    output: list[int]
    length: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    def tokens(self) -> list[int]:
        p = self.prompt
        return p[: self.length] if self.length <= len(p) else p + self.output[: self.length - len(p)]


@dataclass(slots=True, unsafe_hash=True)
class SeqSlice:
    """The tokens of one sequence to run in this step.

    `token_ids` sit at positions start_pos .. start_pos + len - 1; the cache already holds the
    sequence's first `start_pos` tokens in `block_table`, which covers every position of the
    slice. When `sample` is set the runner samples the token at position start_pos + len
    (a non-final chunk of a chunked prefill sets it False). `suppress_token_ids` are masked
    before sampling (EOS and stop tokens while min_tokens is not reached).

    With speculative decoding the last `num_drafts` of `token_ids` are draft tokens: the runner
    verifies them in this one forward and returns every token it emits for the request (the
    accepted drafts, then one corrected or bonus token) in `StepOutput.emitted`.
    `suppress_token_ids` then applies to every verified position (the scheduler proposes no
    draft that would cross the min_tokens boundary).

    With overlapped steps (Scheduler.schedule_next) a decode slice may be scheduled before its
    one token is known: `prev_row` >= 0 says token_ids is (PLACEHOLDER,) and the runner reads
    the token on the device, where the previous step sampled it (row `prev_row` of that step's
    sampled slices).

    `prompt_targets`: the prompt tokens at positions start_pos + 1 .. start_pos + len(it) (at
    most the slice's end, never past the prompt) when the request asks for prompt logprobs:
    the runner reports each one's log-probability from the logits of the position before it
    (StepOutput.prompt_logprobs). Empty for every other slice.

    `allowed` (structured output, sampled slices only): the tokens the sampled position may
    take, as TokenGuide.allowed gives them (bit t % 8 of byte t // 8; tokens past its end
    may not); the runner masks the rest. None: any token. `mask_pending`: an overlapped step's
    guided slice whose mask needs the token still on the way: the runner queues the forward and
    samples once the masks are given (ModelRunner.launch -> PendingSampling.give_masks).

    A slice whose params are `penalized` carries `history`, a view of the sequence's tokens at
    positions 0 .. start_pos - 1: with its own token_ids (a placeholder read on the device) they
    are what the penalties count. Other slices carry None.

    Treat it as immutable (it hashes by value). Not frozen: a frozen dataclass pays an
    object.__setattr__ per field at construction, and a step builds one slice per sequence.
    """

    request_id: str
    token_ids: tuple[int, ...]
    start_pos: int
    block_table: tuple[int, ...]
    sampling: SamplingParams
    sample: bool = True
    suppress_token_ids: tuple[int, ...] = ()
    num_drafts: int = 0
    prev_row: int = -1
    history: History | None = None
    prompt_targets: tuple[int, ...] = ()
    allowed: bytes | None = None
    mask_pending: bool = False

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class StepInput:
    seqs: tuple[SeqSlice, ...]

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A sampled token's log-probability under the model (log-softmax of its logits, before
    temperature, top-k/top-p and suppression) and the `SamplingParams.logprobs` most likely
    tokens as (id, log-probability), most likely first. `rank`: prompt entries only, the
    token's rank in the vocabulary (1 + the tokens strictly more likely)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


@dataclass(frozen=True)
class StepOutput:
    """Sampled token per request id, for the slices that asked for one.

    A slice with drafts is in `emitted` instead: its 1..num_drafts+1 tokens, in order.
    `logprobs`: for sampled slices whose params ask for them (speculation skips those).
    `prompt_logprobs`: for slices with prompt_targets, one entry per target, in order.
    """

    sampled: dict[str, int] = field(default_factory=dict)
    emitted: dict[str, tuple[int, ...]] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[TokenLogprobs, ...]] = field(default_factory=dict)
