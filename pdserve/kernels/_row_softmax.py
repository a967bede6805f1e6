"""Triton helpers for one program reading a whole row: its running max and softmax sum,
tile by tile (shared by the sort-free sampling kernels, nucleus.py and sample.py)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_max_sum(mx, z, x, scale):
    """One tile of a row's running max and softmax sum, per lane: (max(mx, x), z rescaled to
    the new max plus exp2((x - new) * scale)); lanes still at -inf keep a zero sum."""
    new = tl.maximum(mx, x)
    live = new > float("-inf")
    base = tl.where(live, new, 0.0)
    z = tl.where(live, z * tl.exp2((mx - base) * scale) + tl.exp2((x - base) * scale), 0.0)
    return new, z


@triton.jit
def row_total(mx, z, scale):
    """The lanes of online_max_sum reduced: (the row's max m, sum of exp2((x - m) * scale))."""
    m = tl.max(mx, 0)
    return m, tl.sum(tl.where(mx > float("-inf"), z * tl.exp2((mx - m) * scale), 0.0), 0)
