"""A model stand-in for scheduler tests: the next token is a pure function of the sequence so far.

It keeps a 'cache' keyed by (block, offset) exactly as a paged KV cache would, and checks that
every slice reads only positions that were written before, through its own block table. Like
ModelRunner it can `launch` (the engine loop then overlaps steps): a placeholder token
(SeqSlice.prev_row) is read from the previous step's sampled tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pdserve.core.step_io import StepInput, StepOutput


@dataclass
class Done:
    out: StepOutput

    def result(self) -> StepOutput:
        return self.out


class FakeRunner:
    def __init__(self, block_size: int, vocab: int = 1000) -> None:
        self.block_size = block_size
        self.vocab = vocab
        self.cache: dict[tuple[int, int], tuple[int, int]] = {}  # slot -> (position, token)
        self.steps: list[StepInput] = []
        self.placeholders = 0  # slices whose token came from the step before
        self._last: list[tuple[str, int]] = []  # the last step's sampled (request, token), in order

    def launch(self, step: StepInput, layer_hook=None) -> Done:
        return Done(self.execute(step, layer_hook))

    def execute(self, step: StepInput, layer_hook=None) -> StepOutput:
        self.steps.append(step)
        out = {}
        for sl in step.seqs:
            if sl.prev_row >= 0:
                rid, tok = self._last[sl.prev_row]
                assert rid == sl.request_id, f"row {sl.prev_row} of the last step is {rid}, not {sl.request_id}"
                sl = replace(sl, token_ids=(tok,), prev_row=-1)
                self.placeholders += 1
            self._write(sl)
            if sl.sample:
                history = [self._read(sl.block_table, p) for p in range(sl.end_pos)]
                tok = hash(tuple(history)) % self.vocab
                while tok in sl.suppress_token_ids:
                    tok = (tok + 1) % self.vocab
                out[sl.request_id] = tok
        self._last = list(out.items())
        return StepOutput(out)

    def _write(self, sl) -> None:
        """Store the slice's input tokens in its slots, as a forward writes their KV."""
        for i, tok in enumerate(sl.token_ids):
            pos = sl.start_pos + i
            self.cache[self._slot(sl.block_table, pos)] = (pos, tok)

    def _slot(self, table: tuple[int, ...], pos: int) -> tuple[int, int]:
        return table[pos // self.block_size], pos % self.block_size

    def _read(self, table: tuple[int, ...], pos: int) -> int:
        got_pos, tok = self.cache[self._slot(table, pos)]
        assert got_pos == pos, f"slot for position {pos} holds position {got_pos}"
        return tok
