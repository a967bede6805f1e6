"""Speculative decoding in the serving scheduler (pure Python): the drafts of a decode step.

Each step, a running sequence may carry up to K n-gram drafts after its last token (one slice
of 1 + K tokens; `SeqSlice.num_drafts`). The planner bounds them so that a verify never runs
past max_tokens or max_model_len, never straddles the min_tokens boundary (a slice's
suppressed ids then hold for every verified position) and fits the step's token budget. Draft
positions get KV slots: the blocks the sequence already holds, plus new ones only while enough
stay free for every running sequence to grow by one (speculation never causes a preemption
that plain decoding would not). After the verify, the scheduler frees the blocks that only
rejected drafts used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Sequence, SeqStatus
from pdserve.core.spec_gate import BatchGate
from pdserve.core.speculative import NgramProposer, SpecStats, SpeculativeConfig


def draft_limit(seq: Sequence, k: int, max_model_len: int) -> int:
    """Most drafts seq may verify now: every verified position could be emitted."""
    n_out, p = len(seq.output_ids), seq.params
    if p.logprobs is not None or p.penalized or p.logit_bias:  # verify steps report no logprobs, apply neither
        return 0
    if seq.guide is not None:  # a draft's mask would need the grammar run ahead over the drafts
        return 0
    limit = min(k, p.max_tokens - n_out - 1, max_model_len - len(seq) - 1)
    if n_out < p.min_tokens:  # stay below the boundary: suppression is uniform over the slice
        limit = min(limit, p.min_tokens - n_out - 1)
    return max(limit, 0)


class BatchProposer(Protocol):
    """Drafts for every sequence of a step at once (a draft model: runtime/draft_model.py)."""

    def propose(self, asks: list[tuple[Sequence, int]]) -> dict[str, tuple[int, ...]]:
        """Up to `limit` draft tokens after each sequence's last token, by request id."""
        ...

    def forget(self, request_id: str) -> None:
        """The request finished or was aborted: drop what is kept for it."""
        ...


class DraftPlanner:
    """The drafts of each step (n-gram proposers per sequence, or a BatchProposer for the
    whole step), the batch gate, and the worker's acceptance counters."""

    def __init__(self, cfg: SpeculativeConfig, max_model_len: int,
                 clock: Callable[[], float] = time.monotonic, proposer: BatchProposer | None = None) -> None:
        self.cfg = cfg
        self.max_model_len = max_model_len
        self.stats = SpecStats()
        self._props: dict[str, NgramProposer] = {}
        self._model = proposer  # draft_model: drafts come from it, planned for the whole step
        self._planned: dict[str, tuple[int, ...]] = {}
        self._gate = BatchGate(clock)  # clock: step costs (tests pass a deterministic one)
        self._drafting = True  # this step may carry drafts (the gate's answer)
        self._step = [0, 0]  # drafts proposed and accepted by the verify results since the last step

    def begin_step(self, running: list[Sequence]) -> None:
        """Called by the scheduler before each step with its running sequences: feed the gate
        the verify results recorded since the last call, ask it whether this step drafts, and
        (draft model) propose for every running sequence at once."""
        self._gate.record(*self._step)
        self._step = [0, 0]
        self._drafting = self._gate.allow(len(running))
        self._planned = {}
        if self._drafting and self._model is not None:
            k = self.cfg.num_speculative_tokens
            asks = [(seq, limit) for seq in running if seq.status is SeqStatus.RUNNING
                    and (limit := draft_limit(seq, k, self.max_model_len)) > 0]
            if asks:
                self._planned = self._model.propose(asks)

    def drafts(self, seq: Sequence, budget: int, blocks: BlockManager, reserve: int) -> tuple[int, ...]:
        """Drafts to verify after seq's last token (blocks already cover len(seq) tokens).

        budget: tokens left in this step (the last token included); reserve: free blocks to
        leave for the other running sequences. May extend seq.block_table.
        """
        if not self._drafting:
            return ()
        limit = min(draft_limit(seq, self.cfg.num_speculative_tokens, self.max_model_len), budget - 1)
        if limit <= 0:
            return ()
        if self._model is not None:
            drafts = list(self._planned.get(seq.request_id, ())[:limit])
        else:
            drafts = self._proposer(seq).propose(limit)
        if not drafts:
            return ()
        n, table = len(seq), seq.block_table
        room = len(table) * blocks.block_size - n
        if len(drafts) > room:
            need = blocks.blocks_for(n + len(drafts)) - len(table)
            if blocks.num_free - need >= reserve:
                table += blocks.allocate(need)
            else:
                drafts = drafts[:room]
        return tuple(drafts)

    def verified(self, request_id: str, num_drafts: int, accepted: int) -> None:
        """Record a verify result (stats and the proposer's back-off)."""
        self.stats.record(num_drafts, accepted)
        self._step[0] += num_drafts
        self._step[1] += accepted
        prop = self._props.get(request_id)
        if prop is not None:
            prop.feedback(num_drafts, accepted)

    def forget(self, request_id: str) -> None:
        """The request finished or was aborted."""
        self._props.pop(request_id, None)
        if self._model is not None:
            self._model.forget(request_id)

    def _proposer(self, seq: Sequence) -> NgramProposer:
        """seq's proposer, brought up to date with the tokens emitted since its last use."""
        prop = self._props.get(seq.request_id)
        if prop is None:
            prop = self._props[seq.request_id] = NgramProposer(self.cfg)
            prop.extend(seq.prompt_ids)
        seen = len(prop.tokens) - len(seq.prompt_ids)
        if seen < len(seq.output_ids):
            prop.extend(seq.output_ids[seen:])
        return prop
