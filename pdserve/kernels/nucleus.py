"""Top-k / top-p cut-off of each row of logits without sorting (Triton twin of
reference.nucleus_threshold).

Sampling keeps, per row, the tokens whose logit is at least a threshold: the k-th largest for
top-k, then the smallest logit of the shortest most-likely run whose probability (temperature
applied, renormalised over the top-k) reaches top-p. Sorting a [256, 128k] batch to find it
costs milliseconds; here one program per row finds the same logit by search over the float's
order-preserving integer key: each pass over the row counts the tokens (and sums their
probability mass) at or above NC candidate keys spread over the remaining interval (default
2: the interval shrinks 3-fold per pass; a row's key range, under 2^32, takes at most 21 passes
and a row of real logits far fewer; more candidates per pass cost more compares per element
than the passes they save, measured on an H100 with 4096-token tiles). One program per row reads
its row once per pass, so the sampler sorts instead when a batch has few rows (see
runtime/sampler.py). The
threshold is always the logit of a token of the row, so `logits >= threshold` is the exact kept
set (ties at the threshold are all kept; the sorted twin keeps them too).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, check_device, check_dim, check_dtype, check_last_contiguous
from pdserve.kernels._common import check_row_vector
from pdserve.kernels._row_softmax import online_max_sum, row_total

# Keys tried per pass and tokens per tile: with 16 warps, the fastest of 12 settings on an H100
# with top-k and top-p at 1, 64 and 256 rows and within 16 % of the fastest with top-p alone
# (bench/results/sampler-h100-2026-12-05-s14.json).
_CANDIDATES, _BLOCK = 2, 4096


@triton.jit
def _key(x):
    """fp32 -> int32 key in the same order (negative floats have their magnitude bits flipped)."""
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _value(key):
    """_key's inverse (a scalar int64 key -> fp32)."""
    k = key.to(tl.int32)
    return tl.where(k < 0, k ^ 0x7FFFFFFF, k).to(tl.float32, bitcast=True)


@triton.jit
def _counts(row, v, lo, hi, m, scale, BLOCK: tl.constexpr, NC: tl.constexpr, COUNT: tl.constexpr):
    """Candidates lo < c_1 <= ... <= c_NC < hi, and for each the probability mass
    (exp2((x - m) * scale), unnormalised) and, if COUNT, the count of the row's tokens whose
    key is >= it (padding lanes load -inf: no mass, and COUNT masks them)."""
    cand = lo + (hi - lo) * (tl.arange(0, NC) + 1).to(tl.int64) // (NC + 1)  # in [lo, hi): int32
    cand32 = cand.to(tl.int32)
    cnt = tl.zeros([NC], tl.int32)
    mass = tl.zeros([NC], tl.float32)
    for start in range(0, v, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < v
        x = tl.load(row + offs, mask=inside, other=float("-inf")).to(tl.float32)
        w = tl.exp2((x - m) * scale)
        ge = _key(x)[:, None] >= cand32[None, :]
        mass += tl.sum(tl.where(ge, w[:, None], 0.0), 0)
        if COUNT:
            cnt += tl.sum((ge & inside[:, None]).to(tl.int32), 0)
    return cand, cnt, mass


@triton.jit
def _nucleus_kernel(
    x_ptr, stride_b, v, temp_ptr, k_ptr, p_ptr, out_ptr,
    BLOCK: tl.constexpr, NC: tl.constexpr,
):
    """One program per row: max, key range and softmax sum in one pass, then the top-k search
    (largest key with >= k tokens at or above it), then the top-p search (largest key whose
    mass at or above it reaches top_p times the top-k set's); writes the logit of the key."""
    r = tl.program_id(0).to(tl.int64)
    row = x_ptr + r * stride_b
    scale = 1.4426950408889634 / tl.load(temp_ptr + r)
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    z = tl.zeros([BLOCK], tl.float32)  # per lane: sum of exp2((x - mx) * scale)
    kmin = tl.full([BLOCK], 2147483647, tl.int32)
    kmax = tl.full([BLOCK], -2147483648, tl.int32)
    for start in range(0, v, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < v
        x = tl.load(row + offs, mask=inside, other=float("-inf")).to(tl.float32)
        mx, z = online_max_sum(mx, z, x, scale)
        k = _key(x)
        kmin = tl.where(inside, tl.minimum(kmin, k), kmin)
        kmax = tl.where(inside, tl.maximum(kmax, k), kmax)
    m, total = row_total(mx, z, scale)
    lo = tl.min(kmin, 0).to(tl.int64)  # the search runs in int64: top may be 2^31
    top = tl.max(kmax, 0).to(tl.int64) + 1  # exclusive: no key reaches it
    k_top = tl.load(k_ptr + r)
    p_top = tl.load(p_ptr + r)
    kept = total  # mass of the top-k set
    if (k_top > 0) & (k_top < v):
        hi = top
        while hi - lo > 1:
            cand, cnt, mass = _counts(row, v, lo, hi, m, scale, BLOCK, NC, True)
            ok = cnt >= k_top  # a prefix of the candidates (counts fall as keys rise)
            kept = tl.min(tl.where(ok, mass, kept), 0)
            lo = tl.max(tl.where(ok, cand, lo), 0)
            hi = tl.min(tl.where(ok, hi, cand), 0)
    if p_top < 1.0:
        target = p_top * kept
        hi = top
        while hi - lo > 1:
            cand, cnt, mass = _counts(row, v, lo, hi, m, scale, BLOCK, NC, False)
            ok = mass >= target
            lo = tl.max(tl.where(ok, cand, lo), 0)
            hi = tl.min(tl.where(ok, hi, cand), 0)
    tl.store(out_ptr + r, _value(lo))


def nucleus_threshold(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    *, candidates: int = _CANDIDATES, block: int = _BLOCK, num_warps: int = 16,
) -> torch.Tensor:
    """Per row of logits [B, V], the smallest logit sampling keeps (float32 [B]): top-k first
    (top_k[b] < 1 or >= V: off), then top-p over the softmax of logits / temperature[b]
    renormalised over the top-k (top_p[b] >= 1: off), the most likely token always kept.
    temperature float32 [B] (> 0), top_k int32/int64 [B], top_p float32 [B]. candidates (keys
    tried per pass, a power of two), block (tokens per tile) and num_warps are tuning knobs."""
    assert candidates >= 2 and candidates & (candidates - 1) == 0, f"candidates {candidates} must be a power of two"
    check_dim("logits", logits, 2)
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_last_contiguous("logits", logits)
    b, v = logits.shape
    check_row_vector("temperature", temperature, b, (torch.float32,))
    check_row_vector("top_k", top_k, b, (torch.int32, torch.int64))
    check_row_vector("top_p", top_p, b, (torch.float32,))
    check_device(logits=logits, temperature=temperature, top_k=top_k, top_p=top_p)
    out = torch.empty(b, dtype=torch.float32, device=logits.device)
    if b and v:
        _nucleus_kernel[(b,)](logits, logits.stride(0), v, temperature, top_k, top_p, out,
                              BLOCK=block, NC=candidates, num_warps=num_warps)
    return out
