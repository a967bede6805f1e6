"""Gumbel-max scores with Philox noise, shared by the sampling kernels (sample.py,
sample_temperature.py).

argmax_j (x_j / T + G_j), G_j = -log(-log(U_j)) i.i.d. Gumbel, picks j with probability
softmax(x / T)_j. In base-2 units the same argmax is that of x_j * log2(e) / T - log2(-log2(U_j))
(the two differ by a constant factor and shift), two hardware log2s per token. U_j comes from
Philox keyed by the row's seed: one call gives the numbers of 4 neighbouring tokens (a call per
token made a 128k-token draw compute-bound: 1.71 ms at 256 rows on an H100,
bench/results/sampler-h100-2026-12-05-s15e.json), and token t's number depends on (seed, round,
t) alone, so a draw does not depend on how a kernel tiles or splits the row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, check_dim, check_dtype, check_last_contiguous, check_row_vector

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def uniform_open(bits):
    """uint32 -> float32 uniform in (0, 1), never 0 or 1 (the top 24 bits, centred)."""
    return (bits >> 8).to(tl.float32) * 5.9604644775390625e-08 + 2.9802322387695312e-08


@triton.jit
def gumbel_scores(x, scale, seed, group0, BLOCK: tl.constexpr):
    """x * scale - log2(-log2(U)) for a tile of BLOCK tokens (BLOCK a multiple of 4) whose
    first token is the first of Philox group group0 (a row's token t is in group
    round * cdiv(V, 4) + t // 4). scale = log2(e) / temperature; -inf logits stay -inf."""
    r0, r1, r2, r3 = tl.randint4x(seed, group0 + tl.arange(0, BLOCK // 4))
    u = uniform_open(tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), [BLOCK]))
    return x * scale - tl.log2(-tl.log2(u))


@triton.jit
def first_argmax(best, arg):
    """The first index among lanes holding the maximum score, from per-lane (best score, its
    index; -1 where none): -1 if every lane is -1 (no finite or +inf score was seen)."""
    top = tl.max(best, 0)
    j = tl.min(tl.where((best == top) & (arg >= 0), arg, 2147483647), 0)
    return tl.where(j == 2147483647, -1, j)


def check_draw(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor, block: int) -> tuple[int, int]:
    """The checks both sampling wrappers share; returns logits' (rows, vocab)."""
    check_dim("logits", logits, 2)
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_last_contiguous("logits", logits)
    b, v = logits.shape
    check_row_vector("temperature", temperature, b, (torch.float32,))
    check_row_vector("seeds", seeds, b, (torch.int64,))
    assert v > 0, "logits must have at least one column"
    assert block >= 16 and block & (block - 1) == 0, f"block {block} must be a power of two >= 16"
    return b, v
