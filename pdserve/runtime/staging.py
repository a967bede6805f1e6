"""Host -> device upload of a step's int32 vectors: one tensor build, one copy, no host sync.

On CUDA the values go through a pinned buffer that is reused step after step; an event
recorded after each copy guards the buffer, so refilling it waits only for that copy (never
for the forward pass queued behind it). On CPU the values are just wrapped in a tensor.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence

import torch

from pdserve.core.step_io import SeqSlice

ALIGN = 4  # int32 entries (16 bytes) each uploaded view starts on: see HostStager.upload


def int32_tensor(values: Sequence[int]) -> torch.Tensor:
    """A CPU int32 tensor of a flat int list (array.array is ~4x faster than torch.tensor)."""
    if not values:
        return torch.empty(0, dtype=torch.int32)
    return torch.frombuffer(array("i", values), dtype=torch.int32)


def check_block_ids(tables: torch.Tensor, seqs: Sequence[SeqSlice], num_blocks: int, bs: int) -> None:
    """One min/max over a step's flat host tables; on a hit, name the slice (ValueError).

    Only blocks a slice needs count: an id past its last needed block is never read.
    """
    if tables.numel() == 0:
        return
    lo, hi = tables.aminmax()
    if int(lo) >= 0 and int(hi) < num_blocks:
        return
    for s in seqs:
        used = s.block_table[: -(-s.end_pos // bs)]
        if used and (min(used) < 0 or max(used) >= num_blocks):
            raise ValueError(f"{s.request_id}: block id outside the pool [0, {num_blocks})")


def fill_placeholders(ids: torch.Tensor, rows: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """ids with ids[rows[i, 0]] = prev[rows[i, 1]] for each pair (placeholder index, previous
    step's row), on the device: a step's input tokens sampled by the step queued before it."""
    ids = ids.clone()
    ids[rows[:, 0].long()] = prev[rows[:, 1].long()]
    return ids


def flat_slot_mapping(block_table: tuple[int, ...] | list[int], start: int, end: int, bs: int) -> list[int]:
    """Flat cache slots (block * bs + offset) of positions start..end-1, one range per block."""
    out: list[int] = []
    pos = start
    while pos < end:
        blk, off = divmod(pos, bs)
        n = min(bs - off, end - pos)
        base = block_table[blk] * bs + off
        out.extend(range(base, base + n))
        pos += n
    return out


class HostStager:
    """Uploads several flat int lists as int32 device tensors with a single H2D copy."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        # two pinned buffers in turn: refilling one never waits for the upload out of the other,
        # queued behind the step in flight; this one's upload (two steps back) is long done
        self._pinned: list[torch.Tensor | None] = [None, None]
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0

    def host_buffer(self, n: int) -> torch.Tensor:
        """A pinned int32 buffer of at least n entries, safe to overwrite now."""
        turn = self._turn
        event = self._events[turn]
        if event is not None and not event.query():
            event.synchronize()  # only if the step two back was never waited for
        buf = self._pinned[turn]
        if buf is None or buf.numel() < n:
            buf = self._pinned[turn] = torch.empty(max(1024, 1 << (n - 1).bit_length()), dtype=torch.int32,
                                                   pin_memory=True)
        return buf

    def copied(self) -> None:
        """Record that the copies out of the current pinned buffer have been queued."""
        turn = self._turn
        if self._events[turn] is None:
            self._events[turn] = torch.cuda.Event()
        self._events[turn].record()
        self._turn = 1 - turn

    def upload(self, parts: list[list[int]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """int32 tensors, one per list, built in one go: (device views, host views).

        Each view starts 16 bytes into the buffer's alignment (ALIGN entries): Triton compiles a
        kernel once per alignment pattern of its pointer arguments, so views at offsets that
        follow the step's lengths made prefill forwards compile new variants long after start-up
        (bench/jit_variants.py)."""
        pads = [[0] * (-len(p) % ALIGN) for p in parts]
        flat = list(itertools.chain.from_iterable(itertools.chain.from_iterable(zip(parts, pads))))
        host = int32_tensor(flat)
        if self._cuda:
            buf = self.host_buffer(host.numel())[: host.numel()]
            buf.copy_(host)
            dev = buf.to(self.device, non_blocking=True)
            self.copied()
        else:
            dev = host
        out, views, at = [], [], 0
        for p, pad in zip(parts, pads):
            out.append(dev[at : at + len(p)])
            views.append(host[at : at + len(p)])
            at += len(p) + len(pad)
        return out, views
