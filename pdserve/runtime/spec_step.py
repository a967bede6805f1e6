"""One speculative decode step: every sequence's last token plus its drafts in one forward.

The slices go through the runner's varlen (prefill-style) path, which already attends several
query tokens per sequence over the paged cache; logits are computed at every position and
verified per sequence (runtime/spec_verify.py). KV written for rejected drafts is garbage past
the sequence's new length and is overwritten when those positions are computed again. A step
without any draft takes the runner's ordinary decode path (CUDA graphs included).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_verify import verify_drafts


@dataclass(frozen=True)
class SpecSlice:
    """A decode slice whose token_ids are (last token, *drafts); suppress[i] masks row i."""

    slice: SeqSlice
    num_drafts: int
    suppress: tuple[tuple[int, ...], ...]

    @property
    def drafts(self) -> tuple[int, ...]:
        return self.slice.token_ids[len(self.slice.token_ids) - self.num_drafts :]


@torch.inference_mode()
def execute_speculative(runner: ModelRunner, seqs: list[SpecSlice]) -> dict[str, list[int]]:
    """Run one step; returns the tokens each request emits (accepted drafts + one more)."""
    if not seqs:
        return {}
    step = StepInput(tuple(s.slice for s in seqs))
    if all(s.num_drafts == 0 for s in seqs):
        sampled = runner.execute(step).sampled
        return {rid: [t] for rid, t in sampled.items()}
    runner.check(step)
    ids, positions, meta = runner._prepare(step.seqs)
    meta = dataclasses.replace(meta, logits_indices=None, is_decode=False)
    hidden = runner.model.forward(ids, positions, meta, runner.kv_pool)
    logits = runner.model.compute_logits(hidden)
    out: dict[str, list[int]] = {}
    row = 0
    for s in seqs:
        n = len(s.slice.token_ids)
        last = s.slice.end_pos - 1 - s.num_drafts  # rows of the last token and the drafts
        rows = logits[row + n - 1 - s.num_drafts : row + n]
        out[s.slice.request_id] = verify_drafts(
            rows, s.drafts, s.slice.sampling, last + 1, s.suppress, runner.generator
        )
        row += n
    return out
