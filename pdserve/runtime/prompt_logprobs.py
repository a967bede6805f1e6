"""Prompt logprobs (SamplingParams.prompt_logprobs): every prompt token's log-probability
given the tokens before it, from the logits of the position before it.

A step's slices with `prompt_targets` have their rows' hidden states gathered with the sampled
rows' (the model's final norm runs on both); here they go through the lm_head in pieces of
PIECE_ROWS rows, so that a 2k-token chunk of a 128k vocabulary never holds all its logits at
once (2k x 128k x 6 bytes would be 1.5 GB: bf16 logits and their float32 log-softmax).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pdserve.core.step_io import SeqSlice, TokenLogprobs
from pdserve.runtime.sampler import QueuedLogprobs, to_device, token_logprobs

PIECE_ROWS = 256


@dataclass(frozen=True)
class QueuedPromptLogprobs:
    """The prompt logprobs of a step, queued on the device: owners[i] = (request id, its
    number of consecutive entries in `queued`)."""

    owners: list[tuple[str, int]]
    queued: QueuedLogprobs

    def to_host(self) -> QueuedPromptLogprobs:
        return QueuedPromptLogprobs(self.owners, self.queued.to_host())

    def by_request(self) -> dict[str, tuple[TokenLogprobs, ...]]:
        """Entries per request id, in position order (waits for the device)."""
        entries, out, at = self.queued.entries(), {}, 0
        for rid, n in self.owners:
            out[rid] = tuple(entries[at : at + n])
            at += n
        return out


def prompt_rows(seqs: Sequence[SeqSlice]) -> list[int]:
    """Indices into the step's flat tokens whose logits give the slices' prompt targets: the
    first len(prompt_targets) tokens of each slice that has some, in slice order."""
    rows: list[int] = []
    at = 0
    for s in seqs:
        rows.extend(range(at, at + len(s.prompt_targets)))
        at += len(s.token_ids)
    return rows


def queue_prompt_logprobs(
    hidden: torch.Tensor, seqs: Sequence[SeqSlice], compute_logits: Callable[[torch.Tensor], torch.Tensor],
) -> QueuedPromptLogprobs | None:
    """hidden [R, H]: the final-normed hidden states of prompt_rows(seqs). None: no targets."""
    owners = [(s.request_id, len(s.prompt_targets)) for s in seqs if s.prompt_targets]
    if not owners:
        return None
    targets = [t for s in seqs for t in s.prompt_targets]
    ks = [s.sampling.prompt_logprobs or 0 for s in seqs for _ in s.prompt_targets]
    assert hidden.shape[0] == len(targets), f"{hidden.shape[0]} hidden rows for {len(targets)} prompt targets"
    tokens = to_device(targets, hidden.device)
    k = max(ks)
    pieces = [token_logprobs(compute_logits(hidden[a : a + PIECE_ROWS]), tokens[a : a + PIECE_ROWS], [], [], k,
                             rank=True) for a in range(0, len(targets), PIECE_ROWS)]
    cat = lambda name: torch.cat([getattr(p, name) for p in pieces])  # noqa: E731
    return QueuedPromptLogprobs(owners, QueuedLogprobs(list(range(len(targets))), ks, cat("chosen"), cat("top"),
                                                       cat("top_ids"), cat("ranks")))
