"""CUDA graphs for speculative verify steps: every sequence gets exactly K + 1 query rows.

A verify step of n sequences (each its last token plus 0..K drafts) pads to the next captured
batch size P and to K + 1 rows per sequence, so its shapes are fixed and one graph replays it.
Row layout: sequence i owns rows i(K+1) .. i(K+1)+K; its real tokens come first, then padding
rows with id 0, slot -1 (the KV write skips them) and the position of its last real token (a
valid rotary position). Its seq_len is start + K + 1, so real row j attends exactly keys
0 .. start + j (causal), as in the eager path; padding rows attend a few stale keys and their
logits are never read. Table columns past a sequence's blocks hold valid ids (block 0), and
tables are K + 1 tokens wider than max_model_len needs, so padding reads stay in the pool.
Padded sequences (past n) have seq_len 1, slot -1 and table row 0: they write nothing.

The static buffer is [ids | positions | slots] (P(K+1) entries each, at the largest P), then
seq_lens (P), then tables [P, W]; one pinned mirror, one non-blocking copy per step.
With capture=False (CPU tests) the same buffers run the forward eagerly.
"""

from __future__ import annotations

import torch

from pdserve.core.step_io import SeqSlice
from pdserve.model.llama import AttnMetadata, LlamaModel
from pdserve.runtime.cuda_graph import capture_graphs
from pdserve.runtime.staging import int32_tensor

_SIZES = (1, 2, 4, 8, 16, 32)


def verify_rows(seqs: tuple[SeqSlice, ...], k: int, block_size: int, padded: int, width: int
                ) -> list[int]:
    """ids, positions, slots (padded * (k+1) each), seq_lens (padded), tables (padded * width)."""
    r = k + 1
    ids, pos, slots, lens, tables = [], [], [], [], []
    for s in seqs:
        n, start, bt = len(s.token_ids), s.start_pos, s.block_table
        ids += list(s.token_ids) + [0] * (r - n)
        pos += list(range(start, start + n)) + [start + n - 1] * (r - n)
        slots += [bt[p // block_size] * block_size + p % block_size for p in range(start, start + n)]
        slots += [-1] * (r - n)
        lens.append(start + r)
        row = list(bt[:width])
        tables += row + [0] * (width - len(row))
    pad = padded - len(seqs)
    ids += [0] * (pad * r)
    pos += [0] * (pad * r)
    slots += [-1] * (pad * r)
    lens += [1] * pad
    tables += [0] * (pad * width)
    return ids + pos + slots + lens + tables


class VerifyGraphs:
    """Captured verify forwards (K + 1 rows per sequence); `run` returns their logits."""

    def __init__(self, model: LlamaModel, kv_pool: torch.Tensor, *, block_size: int, max_model_len: int,
                 num_speculative_tokens: int, max_num_seqs: int, capture: bool = True) -> None:
        if num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        self.model, self.kv_pool, self.block_size = model, kv_pool, block_size
        self.k = num_speculative_tokens
        self.num_blocks = kv_pool.shape[2]
        self.sizes = tuple(sorted({b for b in _SIZES if b < max_num_seqs} | {min(max_num_seqs, _SIZES[-1])}))
        self.max_batch = m = self.sizes[-1]
        self.max_model_len = max_model_len
        self.width = -(-(max_model_len + self.k + 1) // block_size)
        r = self.k + 1
        dev = kv_pool.device
        cuda = dev.type == "cuda"
        self._host = torch.zeros(3 * m * r + m + m * self.width, dtype=torch.int32, pin_memory=cuda)
        self._host[2 * m * r : 3 * m * r] = -1  # slots: warm-up and capture write nothing
        self._host[3 * m * r : 3 * m * r + m] = 1  # seq_lens: read one token
        self._static = self._host.to(dev) if cuda else self._host
        self._qsl = torch.arange(0, (m + 1) * r, r, dtype=torch.int32, device=dev)
        self._event = torch.cuda.Event() if cuda else None
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self._capture = capture
        if capture:
            self._capture_all()

    def fits(self, seqs: tuple[SeqSlice, ...]) -> bool:
        """Sampled slices of 1..K+1 tokens, few enough, whose padded rows stay in the tables
        (none asking for prompt logprobs)."""
        return 0 < len(seqs) <= self.max_batch and all(
            s.sample and 1 <= len(s.token_ids) <= self.k + 1 and s.start_pos + self.k + 1 <= self.width * self.block_size
            and s.end_pos <= self.max_model_len and not s.prompt_targets for s in seqs)

    @torch.inference_mode()
    def run(self, seqs: tuple[SeqSlice, ...]) -> tuple[torch.Tensor, list[int]]:
        """Logits [P(K+1), V] (model dtype, valid until the next run) and each slice's first row."""
        padded = next(b for b in self.sizes if b >= len(seqs))
        self._stage(seqs, padded)
        if self._capture:
            self._graphs[padded].replay()
            logits = self._logits[padded]
        else:
            logits = self.forward(padded)
        return logits, [i * (self.k + 1) for i in range(len(seqs))]

    def _stage(self, seqs: tuple[SeqSlice, ...], padded: int) -> None:
        for s in seqs:
            bt = s.block_table[: self.width]
            if bt and (min(bt) < 0 or max(bt) >= self.num_blocks):
                raise ValueError(f"{s.request_id}: block id outside the pool [0, {self.num_blocks})")
        m, r, w = self.max_batch, self.k + 1, self.width
        flat = int32_tensor(verify_rows(seqs, self.k, self.block_size, padded, w))
        if self._event is not None:
            self._event.synchronize()  # the previous copy out of the mirror has finished
        n = padded * r
        h = self._host
        for part in range(3):  # ids, positions, slots: each at its fixed offset
            h[part * m * r : part * m * r + n] = flat[part * n : (part + 1) * n]
        h[3 * m * r : 3 * m * r + padded] = flat[3 * n : 3 * n + padded]
        tables = h[3 * m * r + m :]
        tables[: padded * w] = flat[3 * n + padded :]
        if self._event is not None:
            end = 3 * m * r + m + padded * w
            self._static[:end].copy_(h[:end], non_blocking=True)
            self._event.record()

    def _meta(self, b: int) -> AttnMetadata:
        m, r, s = self.max_batch, self.k + 1, self._static
        return AttnMetadata(
            slot_mapping=s[2 * m * r : 2 * m * r + b * r],
            block_tables=s[3 * m * r + m :].view(m, self.width)[:b],
            seq_lens=s[3 * m * r : 3 * m * r + b],
            query_start_loc=self._qsl[: b + 1],
            is_decode=False,
        )

    def forward(self, b: int) -> torch.Tensor:
        """Logits [b(K+1), V] (model dtype) of the first b sequences of the static buffers."""
        m, r, s = self.max_batch, self.k + 1, self._static
        hidden = self.model.forward(s[: b * r], s[m * r : m * r + b * r], self._meta(b), self.kv_pool)
        return self.model.compute_logits(hidden)

    def _capture_all(self) -> None:
        self._graphs, self._logits = capture_graphs(self.sizes, self.forward)
