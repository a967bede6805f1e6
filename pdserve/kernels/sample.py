"""Temperature and top-p sampling of each row of logits in one kernel: no sort, no probability
tensor (distribution twin: reference.top_p_probs; the sampler's sorted path draws from it).

One program per row. Without top-p a draw is one pass: the Gumbel-max trick (_gumbel.py: Philox
noise keyed by the row's seed and the token's index) picks token j with probability
softmax(x / T)_j; sample_temperature.py draws the same token splitting the row over programs,
which the sampler uses for such rows. With top-p (rejection
sampling, as FlashInfer's sampling kernels do): a first pass finds the row's max and softmax
sum, then a draw over the tokens above a pivot (at first none is excluded) and a pass summing
the mass of the tokens strictly more likely than the drawn one; if that mass is under top_p the
token is in the nucleus and is the answer, else every token at or below it is outside too, the
pivot rises to it and the next round draws again with fresh numbers. The answer's distribution
is exactly the nucleus's (each round draws from the nucleus's distribution conditioned on the
tokens above the pivot, a superset of the nucleus), and a round succeeds with probability at
least top_p, so a row takes 1 / top_p rounds on average. After MAX_ROUNDS (never reached in
practice: at top_p 0.1 the chance is below 0.9^64) the row's most likely token is returned.
Ties: a token is in the nucleus when the mass strictly above it is under top_p, so tokens of
equal logit are kept or dropped together, as nucleus_threshold's `logits >= threshold` keeps them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import check_device
from pdserve.kernels._common import check_row_vector
from pdserve.kernels._gumbel import LOG2E, check_draw, first_argmax, gumbel_scores
from pdserve.kernels._row_softmax import online_max_sum, row_total

_BLOCK = 4096  # tokens per tile (the nucleus kernel's, measured there)
MAX_ROUNDS = 64


@triton.jit
def _draw(row, v, scale, pivot, seed, round_no, BLOCK: tl.constexpr):
    """argmax over the tokens with logit > pivot of their Gumbel-max score (_gumbel; scale =
    log2(e) / T; first index of the maximum); -1 if no token is above the pivot. Round 0 draws
    the token sample_temperature draws for the same seed."""
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    arg = tl.full([BLOCK], -1, tl.int32)
    groups = (v + 3) // 4
    for start in range(0, v, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row + offs, mask=offs < v, other=float("-inf")).to(tl.float32)
        score = gumbel_scores(x, scale, seed, round_no * groups + start // 4, BLOCK)
        score = tl.where(x > pivot, score, float("-inf"))
        better = score > best
        best = tl.where(better, score, best)
        arg = tl.where(better, offs, arg)
    return first_argmax(best, arg)


@triton.jit
def _mass_above(row, v, bound, m, scale, BLOCK: tl.constexpr):
    """Sum of exp2((x - m) * scale) over the tokens with logit > bound."""
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, v, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row + offs, mask=offs < v, other=float("-inf")).to(tl.float32)
        acc += tl.where(x > bound, tl.exp2((x - m) * scale), 0.0)
    return tl.sum(acc, 0)


@triton.jit
def _sample_kernel(
    x_ptr, stride_b, v, temp_ptr, p_ptr, seed_ptr, out_ptr, rounds_ptr,
    BLOCK: tl.constexpr, MAX_R: tl.constexpr, RECORD: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    row = x_ptr + r * stride_b
    temp = tl.load(temp_ptr + r)
    scale = LOG2E / temp
    top_p = tl.load(p_ptr + r)
    seed = tl.load(seed_ptr + r)
    neg_inf = temp * 0.0 + float("-inf")  # an fp32 scalar tensor (loop-carried)
    if top_p >= 1.0:
        token = _draw(row, v, scale, neg_inf, seed, 0, BLOCK)
        rounds = tl.program_id(0) * 0 + 1
    else:
        mx = tl.full([BLOCK], float("-inf"), tl.float32)
        z = tl.zeros([BLOCK], tl.float32)  # per lane: sum of exp2((x - mx) * scale)
        am = tl.zeros([BLOCK], tl.int32)  # per lane: first index of its max (0 if all -inf)
        for start in range(0, v, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row + offs, mask=offs < v, other=float("-inf")).to(tl.float32)
            am = tl.where(x > mx, offs, am)
            mx, z = online_max_sum(mx, z, x, scale)
        m, total = row_total(mx, z, scale)
        argmax = tl.min(tl.where(mx == m, am, 2147483647), 0)
        target = top_p * total
        pivot = neg_inf
        token = tl.program_id(0) * 0 - 1
        rounds = tl.program_id(0) * 0
        while token < 0:
            j = _draw(row, v, scale, pivot, seed, rounds, BLOCK)
            xj = tl.load(row + tl.maximum(j, 0)).to(tl.float32)
            inside = (j >= 0) & (_mass_above(row, v, xj, m, scale, BLOCK) < target)
            rounds += 1
            token = tl.where(inside, j, tl.where(rounds >= MAX_R, argmax, -1))
            pivot = xj
    tl.store(out_ptr + r, tl.maximum(token, 0).to(tl.int64))  # a row of -inf only: token 0
    if RECORD:
        tl.store(rounds_ptr + r, rounds)


def sample_top_p(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, seeds: torch.Tensor,
    *, block: int = _BLOCK, num_warps: int = 16, max_rounds: int = MAX_ROUNDS,
    rounds: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row of logits [B, V] (int64 [B]), drawn from softmax(logits / temperature)
    cut to its top-p nucleus (top_p[b] >= 1: no cut). temperature float32 [B] (> 0), top_p
    float32 [B] (> 0), seeds int64 [B]: the Philox key of the row's draws (equal seeds and
    logits give equal tokens). -inf logits are never drawn. rounds (int32 [B], optional) gets
    the rejection rounds each row took. block (tokens per tile) and num_warps are tuning knobs."""
    b, v = check_draw(logits, temperature, seeds, block)
    check_row_vector("top_p", top_p, b, (torch.float32,))
    assert max_rounds >= 1, f"max_rounds {max_rounds} must be >= 1"
    check_device(logits=logits, temperature=temperature, top_p=top_p, seeds=seeds)
    if rounds is not None:
        check_row_vector("rounds", rounds, b, (torch.int32,))
        check_device(logits=logits, rounds=rounds)
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    if b:
        _sample_kernel[(b,)](logits, logits.stride(0), v, temperature, top_p, seeds, out,
                             out if rounds is None else rounds, BLOCK=max(16, min(block, triton.next_power_of_2(v))),
                             MAX_R=max_rounds, RECORD=rounds is not None, num_warps=num_warps)
    return out
