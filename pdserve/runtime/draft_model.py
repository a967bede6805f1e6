"""Draft-model speculation: a smaller model with the target's tokenizer proposes K tokens.

`--speculative-config '{"model": DIR, "num_speculative_tokens": K}'` on the decode worker.
The draft model has its own ModelRunner, KV pool and block bookkeeping. Each step, for every
running sequence at once: one forward feeds the tokens the draft has not cached yet (the whole
prompt the first time, afterwards the tokens emitted since the last step) and samples the
first draft, then K - 1 single-token steps sample the rest, queued without waiting (each reads
its token on the device where the step before sampled it). Drafts are greedy (argmax): a
point-mass proposal, so runtime/spec_verify.py's rule keeps sampled output exact.

What the draft pool holds for a sequence is its real tokens up to the last step plus the
drafts it wrote then; the next step keeps the drafts the target accepted (they match the real
tokens) and overwrites from the first mismatch. Sequences whose blocks do not fit in the draft
pool get no drafts that step (never an error).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.core.block_manager import BlockManager, NoFreeBlocks
from pdserve.core.request import Sequence
from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import PLACEHOLDER, SeqSlice, StepInput
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner

_GREEDY = SamplingParams(temperature=0.0)


def check_draft_model(draft: ModelSpec, target_vocab_size: int, max_model_len: int | None = None) -> None:
    """ValueError naming why `draft` cannot draft for the target: another vocabulary (so another
    tokenizer), or a context shorter than max_model_len."""
    if draft.vocab_size != target_vocab_size:
        raise ValueError(f"--speculative-config model: vocab_size {draft.vocab_size} differs from the "
                         f"target's {target_vocab_size}: a draft model must share the tokenizer")
    if max_model_len is not None and max_model_len > draft.max_position_embeddings:
        raise ValueError(f"--speculative-config model: --max-model-len {max_model_len} exceeds the draft "
                         f"model's {draft.max_position_embeddings}")


@dataclass
class _Cached:
    """What the draft pool holds for one sequence: real tokens [0, real) and, after them,
    the drafts written at the last step."""

    table: list[int] = field(default_factory=list)
    real: int = 0
    written: tuple[int, ...] = ()


class DraftModelProposer:
    """BatchProposer (core/spec_schedule.py) over a draft ModelRunner."""

    def __init__(self, runner: ModelRunner, target_vocab_size: int) -> None:
        check_draft_model(runner.spec, target_vocab_size)
        self.runner = runner
        self.blocks = BlockManager(runner.num_blocks, runner.block_size)
        self._seqs: dict[str, _Cached] = {}

    def propose(self, asks: list[tuple[Sequence, int]]) -> dict[str, tuple[int, ...]]:
        """Up to `limit` greedy drafts after each sequence's last token."""
        first: list[SeqSlice] = []
        todo: dict[str, tuple[int, int, tuple[int, ...]]] = {}  # rid -> (length, drafts wanted, table)
        for seq, limit in asks:
            n = len(seq)
            if n + limit - 1 > self.runner.max_model_len:
                continue
            cached = self._seqs.setdefault(seq.request_id, _Cached())
            valid = self._valid(cached, seq)
            if not self._room(cached, n + limit - 1):
                continue
            table = tuple(cached.table)
            first.append(SeqSlice(seq.request_id, seq.token_slice(valid, n), valid, table, _GREEDY))
            todo[seq.request_id] = (n, limit, table)
        if not first:
            return {}
        # The K steps are queued back to back: each later one reads its token where the step
        # before sampled it, on the device (prev_row), so the host waits once, not K times.
        launched = [self.runner.launch(StepInput(tuple(first)))]
        for i in range(1, max(limit for _, limit, _ in todo.values())):
            row = {rid: r for r, rid in enumerate(launched[-1].request_ids)}
            step = tuple(SeqSlice(rid, (PLACEHOLDER,), n + i - 1, table, _GREEDY, prev_row=row[rid])
                         for rid, (n, limit, table) in todo.items() if limit > i)
            launched.append(self.runner.launch(StepInput(step)))
        drafts: dict[str, list[int]] = {}
        for done in launched:
            for rid, tok in done.result().sampled.items():
                drafts.setdefault(rid, []).append(tok)
        for rid, (n, _, _) in todo.items():
            cached = self._seqs[rid]
            cached.real, cached.written = n, tuple(drafts[rid][:-1])  # the last draft has no KV
        return {rid: tuple(d) for rid, d in drafts.items()}

    def forget(self, request_id: str) -> None:
        cached = self._seqs.pop(request_id, None)
        if cached is not None and cached.table:
            self.blocks.free(cached.table)

    def _valid(self, cached: _Cached, seq: Sequence) -> int:
        """Positions whose KV in the draft pool matches seq's tokens (at most len(seq) - 1: the
        last token is always fed, to sample the first draft)."""
        n = len(seq)
        valid = min(cached.real, n)
        for tok in cached.written:  # the drafts the target kept are real tokens now
            if valid >= n or seq.token_slice(valid, valid + 1)[0] != tok:
                break
            valid += 1
        return min(valid, n - 1)

    def _room(self, cached: _Cached, positions: int) -> bool:
        """Blocks for `positions` positions (False when the draft pool is full)."""
        need = self.blocks.blocks_for(positions) - len(cached.table)
        if need <= 0:
            return True
        try:
            cached.table += self.blocks.allocate(need)
        except NoFreeBlocks:
            return False
        return True
