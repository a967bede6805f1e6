"""CUDA graphs for pure-decode steps: embedding -> layers -> final norm -> lm_head logits.

One graph per captured batch size, all reading one static int32 device buffer laid out as
[ids | positions | slots | seq_lens] (M entries each, M the largest size) followed by block
tables [M, W], W = ceil(max_model_len / block_size). A step of n sequences pads to the next
captured size P: padded rows have slot -1 (the Triton KV write skips it), seq_len 1 and a
table row of block 0, so they write nothing and read one harmless token. The step's values
are written into a pinned mirror of that buffer and copied with one non-blocking H2D copy;
only table columns the batch needs are refreshed (the rest keep old, valid block ids, which
seq_lens never lets the kernel reach). The decode kernel's split-K partition count derives
from W, a constant, so the captured launch grid is valid for every replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdserve.core.step_io import SeqSlice
from pdserve.model.llama import AttnMetadata, LlamaModel

_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


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


def decode_rows(seqs: tuple[SeqSlice, ...], block_size: int, padded: int) -> DecodeRows:
    """Flat host lists for a decode batch (one new token per slice) padded to `padded` rows."""
    bs, n = block_size, len(seqs)
    if not 0 < n <= padded:
        raise ValueError(f"{n} sequences do not fit a batch of {padded}")
    width = max(1, max(-(-s.end_pos // bs) for s in seqs))
    ids, pos, slots, lens, tables = [], [], [], [], []
    for s in seqs:
        if len(s.token_ids) != 1:
            raise ValueError(f"{s.request_id}: a decode slice has exactly one token")
        p, bt = s.start_pos, s.block_table
        ids.append(s.token_ids[0])
        pos.append(p)
        slots.append(bt[p // bs] * bs + p % bs)
        lens.append(p + 1)
        tables.extend(bt[:width])
        if len(bt) < width:
            tables.extend([0] * (width - len(bt)))
    pad = padded - n
    if pad:
        ids.extend([0] * pad)
        pos.extend([0] * pad)
        slots.extend([-1] * pad)
        lens.extend([1] * pad)
        tables.extend([0] * (pad * width))
    return DecodeRows(ids + pos + slots + lens, tables, padded, width)


class DecodeGraphs:
    """Captured decode forwards over one model and KV pool; `run` replays the right one."""

    def __init__(
        self, model: LlamaModel, kv_pool: torch.Tensor, *, block_size: int, max_model_len: int,
        max_num_seqs: int,
    ) -> None:
        self.model, self.kv_pool, self.block_size = model, kv_pool, block_size
        self.sizes = capture_sizes(max_num_seqs)
        self.max_batch = m = self.sizes[-1]
        self.width = -(-max_model_len // block_size)
        dev = kv_pool.device
        n = 4 * m + m * self.width
        host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        host[2 * m : 3 * m] = -1  # slots: padding writes nowhere
        host[3 * m : 4 * m] = 1  # seq_lens: padding reads one token
        self._host = host
        self._static = host.to(dev)
        self._qsl = torch.arange(m + 1, dtype=torch.int32, device=dev)
        self._event = torch.cuda.Event()
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self._capture_all()

    def fits(self, seqs: tuple[SeqSlice, ...]) -> bool:
        """A pure-decode batch small enough, whose tables fit the static width."""
        return (
            0 < len(seqs) <= self.max_batch
            and all(len(s.token_ids) == 1 and s.end_pos <= self.width * self.block_size for s in seqs)
        )

    @torch.inference_mode()
    def run(self, seqs: tuple[SeqSlice, ...]) -> torch.Tensor:
        """float32 logits [len(seqs), V] of a decode batch (valid until the next run)."""
        padded = self.stage(seqs)
        self._graphs[padded].replay()
        return self._logits[padded][: len(seqs)]

    def stage(self, seqs: tuple[SeqSlice, ...]) -> int:
        """Queue the batch's inputs into the static buffer; returns the padded batch size."""
        padded = padded_size(len(seqs), self.sizes)
        assert padded is not None, f"{len(seqs)} sequences exceed the captured {self.max_batch}"
        self._write(decode_rows(seqs, self.block_size, padded))
        return padded

    def _write(self, rows: DecodeRows) -> None:
        """Write rows into the pinned mirror and queue one H2D copy of what changed."""
        m, p, w, big_w = self.max_batch, rows.padded, rows.width, self.width
        self._event.synchronize()  # the previous copy out of the mirror has finished
        vec = torch.tensor(rows.vectors, dtype=torch.int32).view(4, p)
        self._host[: 4 * m].view(4, m)[:, :p] = vec
        tab = torch.tensor(rows.tables, dtype=torch.int32).view(p, w)
        self._host[4 * m :].view(m, big_w)[:p, :w] = tab
        end = 4 * m + p * big_w
        self._static[:end].copy_(self._host[:end], non_blocking=True)
        self._event.record()

    def _meta(self, b: int) -> AttnMetadata:
        m, s = self.max_batch, self._static
        return AttnMetadata(
            slot_mapping=s[2 * m : 2 * m + b],
            block_tables=s[4 * m :].view(m, self.width)[:b],
            seq_lens=s[3 * m : 3 * m + b],
            query_start_loc=self._qsl[: b + 1],
            is_decode=True,
        )

    def _forward(self, b: int) -> torch.Tensor:
        m, s = self.max_batch, self._static
        hidden = self.model.forward(s[:b], s[m : m + b], self._meta(b), self.kv_pool)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        """Largest first, all in one memory pool (replays never overlap)."""
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.sizes):
            self._forward(b)  # warm-up: Triton compiles and autotunes outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._logits[b] = self._forward(b)
            self._graphs[b] = graph
        torch.cuda.synchronize()
