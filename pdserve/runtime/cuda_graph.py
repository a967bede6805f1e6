"""CUDA graphs for pure-decode steps: embedding -> layers -> final norm -> lm_head logits.

One graph per captured batch size, all reading one static int32 device buffer laid out as
[ids | positions | slots | seq_lens | prev_rows] (M entries each, M the largest size) followed
by block tables [M, W], W = ceil(max_model_len / block_size). A row whose prev_row is >= 0
takes its token from the runner's `prev_tokens` (what the step before sampled), inside the
graph, so a step can be queued before the host knows its tokens. A step of n sequences pads to the next
captured size P: padded rows have slot -1 (the Triton KV write skips it), seq_len 1 and a
table row left from an earlier step (valid block ids), so they write nothing and read one
harmless token. The step's values are written into a pinned mirror of that buffer and copied
with one non-blocking H2D copy; a table row is rewritten only when its (request, table)
changed (columns past a row's table keep old valid ids, which seq_lens never lets the kernel
reach). The decode kernel's split-K partition count derives from W, a constant, so the
captured launch grid is valid for every replay. With capture=False (CPU tests) the buffers
work the same and `forward` runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pdserve.core.step_io import SeqSlice
from pdserve.model.llama import AttnMetadata, LlamaModel
from pdserve.runtime.staging import int32_tensor

_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@torch.inference_mode()
def capture_graphs(
    sizes: tuple[int, ...], forward: Callable[[int], torch.Tensor]
) -> tuple[dict[int, torch.cuda.CUDAGraph], dict[int, torch.Tensor]]:
    """One graph of forward(b) per size, largest first, all in one memory pool (replays never
    overlap); returns the graphs and the output tensor each one writes."""
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    outputs: dict[int, torch.Tensor] = {}
    pool = torch.cuda.graph_pool_handle()
    for b in reversed(sizes):
        forward(b)  # warm-up: Triton compiles and autotunes outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outputs[b] = forward(b)
        graphs[b] = graph
    torch.cuda.synchronize()
    return graphs, outputs


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Powers of two below max_num_seqs (up to 256), then max_num_seqs itself."""
    if max_num_seqs < 1:
        raise ValueError("max_num_seqs must be positive")
    return tuple(b for b in _SIZES if b < max_num_seqs) + (max_num_seqs,)


def padded_size(n: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest captured size >= n, or None when n exceeds them all."""
    for b in sizes:
        if b >= n:
            return b
    return None


@dataclass(frozen=True)
class DecodeRows:
    """Host values of one padded decode batch.

    `vectors`: ids, positions, slots, seq_lens (each `padded` long) concatenated;
    `tables`: `padded` rows of `width` block ids, row-major.
    """

    vectors: list[int]
    tables: list[int]
    padded: int
    width: int


def decode_vectors(seqs: tuple[SeqSlice, ...], block_size: int, padded: int) -> list[int]:
    """ids, positions, slots, seq_lens, prev_rows of a decode batch (one new token per slice),
    each padded to `padded` entries (padding: id 0, position 0, slot -1, seq_len 1, row -1),
    concatenated."""
    bs, n = block_size, len(seqs)
    if not 0 < n <= padded:
        raise ValueError(f"{n} sequences do not fit a batch of {padded}")
    ids, pos, slots, lens, rows = [], [], [], [], []
    for s in seqs:
        if len(s.token_ids) != 1:
            raise ValueError(f"{s.request_id}: a decode slice has exactly one token")
        p, bt = s.start_pos, s.block_table
        ids.append(s.token_ids[0])
        pos.append(p)
        slots.append(bt[p // bs] * bs + p % bs)
        lens.append(p + 1)
        rows.append(s.prev_row)
    pad = padded - n
    return ids + [0] * pad + pos + [0] * pad + slots + [-1] * pad + lens + [1] * pad + rows + [-1] * pad


def decode_rows(seqs: tuple[SeqSlice, ...], block_size: int, padded: int) -> DecodeRows:
    """decode_vectors plus block tables as wide as the batch needs (padding rows: block 0)."""
    vectors = decode_vectors(seqs, block_size, padded)
    width = max(1, max(-(-s.end_pos // block_size) for s in seqs))
    tables: list[int] = []
    for s in seqs:
        bt = s.block_table
        tables.extend(bt[:width])
        if len(bt) < width:
            tables.extend([0] * (width - len(bt)))
    tables.extend([0] * ((padded - len(seqs)) * width))
    return DecodeRows(vectors, tables, padded, width)


class DecodeGraphs:
    """Captured decode forwards over one model and KV pool; `run` replays the right one."""

    def __init__(
        self, model: LlamaModel, kv_pool: torch.Tensor, *, block_size: int, max_model_len: int,
        max_num_seqs: int, prev_tokens: torch.Tensor | None = None, capture: bool = True,
    ) -> None:
        self.model, self.kv_pool, self.block_size = model, kv_pool, block_size
        self.num_blocks = kv_pool.shape[2]
        self.sizes = capture_sizes(max_num_seqs)
        self.max_batch = m = self.sizes[-1]
        self.width = -(-max_model_len // block_size)
        dev = kv_pool.device
        self.prev_tokens = prev_tokens if prev_tokens is not None else torch.zeros(
            m, dtype=torch.int32, device=kv_pool.device)
        n = 5 * m + m * self.width
        cuda = dev.type == "cuda"
        host = torch.zeros(n, dtype=torch.int32, pin_memory=cuda)
        host[2 * m : 3 * m] = -1  # slots: padding writes nowhere
        host[3 * m : 4 * m] = 1  # seq_lens: padding reads one token
        host[4 * m : 5 * m] = -1  # prev_rows: tokens given
        self._static = host.to(dev) if cuda else host  # CPU: the mirror is the buffer
        # CUDA: two mirrors taken in turn, so staging a step never waits for the copy out of the
        # mirror the step before it reads (still queued behind the step before that); the copy
        # out of this one, two steps back, is done once that step's tokens were read.
        self._mirrors = [host, host.clone().pin_memory()] if cuda else [host]
        self._events = [torch.cuda.Event(), torch.cuda.Event()] if cuda else []
        self._owners: list[list[tuple[str, tuple[int, ...]] | None]] = [[None] * m for _ in self._mirrors]
        self._turn = 0
        self._qsl = torch.arange(m + 1, dtype=torch.int32, device=dev)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def fits(self, seqs: tuple[SeqSlice, ...]) -> bool:
        """A pure-decode batch small enough, whose tables fit the static width (and no prompt
        logprobs: a one-token chunk of a prompt may ask for them)."""
        return (
            0 < len(seqs) <= self.max_batch
            and all(len(s.token_ids) == 1 and s.end_pos <= self.width * self.block_size and not s.prompt_targets
                    for s in seqs)
        )

    @torch.inference_mode()
    def run(self, seqs: tuple[SeqSlice, ...]) -> torch.Tensor:
        """Logits [len(seqs), V] (model dtype) of a decode batch (valid until the next run)."""
        padded = self.stage(seqs)
        self._graphs[padded].replay()
        return self._logits[padded][: len(seqs)]

    def stage(self, seqs: tuple[SeqSlice, ...]) -> int:
        """Queue the batch's inputs into the static buffer; returns the padded batch size.

        Only table rows whose (request, table) changed since the last step are rewritten in
        the pinned mirror (a table grows one block every block_size steps). ValueError, with
        nothing queued, if a new row holds a block id outside the pool.
        """
        padded = padded_size(len(seqs), self.sizes)
        assert padded is not None, f"{len(seqs)} sequences exceed the captured {self.max_batch}"
        vec = int32_tensor(decode_vectors(seqs, self.block_size, padded)).view(5, padded)
        turn = self._turn
        host, owners = self._mirrors[turn], self._owners[turn]
        keys = [(s.request_id, s.block_table) for s in seqs]
        changed = [i for i, k in enumerate(keys) if owners[i] != k]
        for i in changed:
            bt = seqs[i].block_table[: self.width]
            if bt and (min(bt) < 0 or max(bt) >= self.num_blocks):
                raise ValueError(f"{seqs[i].request_id}: block id outside the pool [0, {self.num_blocks})")
        m, big_w = self.max_batch, self.width
        if self._events and not self._events[turn].query():
            self._events[turn].synchronize()  # only if the step two back was never read
        host[: 5 * m].view(5, m)[:, :padded] = vec
        tables = host[5 * m :].view(m, big_w)
        for i in changed:
            bt = keys[i][1][:big_w]
            tables[i, : len(bt)] = int32_tensor(bt)
            owners[i] = keys[i]
        if self._events:
            end = 5 * m + padded * big_w
            self._static[:end].copy_(host[:end], non_blocking=True)
            self._events[turn].record()
            self._turn = 1 - turn
        return padded

    def _meta(self, b: int) -> AttnMetadata:
        m, s = self.max_batch, self._static
        return AttnMetadata(
            slot_mapping=s[2 * m : 2 * m + b],
            block_tables=s[5 * m :].view(m, self.width)[:b],
            seq_lens=s[3 * m : 3 * m + b],
            query_start_loc=self._qsl[: b + 1],
            is_decode=True,
        )

    def forward(self, b: int) -> torch.Tensor:
        """Logits [b, V] (model dtype) of the first b rows of the static buffers (what a graph holds)."""
        m, s = self.max_batch, self._static
        rows = s[4 * m : 4 * m + b]
        ids = torch.where(rows >= 0, self.prev_tokens.index_select(0, rows.clamp(min=0)), s[:b])
        hidden = self.model.forward(ids, s[m : m + b], self._meta(b), self.kv_pool)
        return self.model.compute_logits(hidden)

    def _capture_all(self) -> None:
        self._graphs, self._logits = capture_graphs(self.sizes, self.forward)
