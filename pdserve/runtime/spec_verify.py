"""Verification of draft tokens: rejection sampling that keeps the target distribution exact.

For a point-mass draft d (n-gram lookup), the standard rule accept-with-min(1, p/q) becomes
accept with probability p(d); on rejection the token is drawn from the residual max(p - q, 0)
renormalised, i.e. p with d removed. Greedy requests accept while the draft equals the argmax.
Seeded requests draw position p's uniform and residual from position_seed(seed, p).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pdserve.core.sampling import SamplingParams
from pdserve.runtime.sampler import position_seed, token_probs


def verify_drafts(
    logits: torch.Tensor,
    drafts: Sequence[int],
    params: SamplingParams,
    first_pos: int,
    suppress: Sequence[Sequence[int]],
    generator: torch.Generator | None,
) -> list[int]:
    """Tokens emitted for one sequence: the accepted drafts plus one corrected/bonus token.

    logits [len(drafts) + 1, V]: row i predicts position first_pos + i (row i > 0 follows
    draft i - 1). suppress[i]: ids masked in row i.
    """
    logits = logits.float().clone()
    for i, ids in enumerate(suppress):
        if ids:
            logits[i, list(ids)] = float("-inf")
    if params.greedy:
        return _verify_greedy(logits, drafts)
    probs = token_probs(logits, [params] * logits.shape[0])
    out: list[int] = []
    for i, d in enumerate(drafts):
        g = _generator(params, first_pos + i, generator, probs.device)
        u = torch.rand((), generator=g, device=probs.device)
        if u.item() < probs[i, d].item():
            out.append(d)
            continue
        residual = probs[i].clone()
        residual[d] = 0.0
        out.append(_categorical(residual, g))
        return out
    g = _generator(params, first_pos + len(drafts), generator, probs.device)
    out.append(_categorical(probs[len(drafts)], g))
    return out


def _verify_greedy(logits: torch.Tensor, drafts: Sequence[int]) -> list[int]:
    target = logits.argmax(dim=-1).tolist()
    out: list[int] = []
    for i, d in enumerate(drafts):
        if target[i] != d:
            break
        out.append(d)
    out.append(target[len(out)])
    return out


def _generator(
    params: SamplingParams, pos: int, fallback: torch.Generator | None, device: torch.device
) -> torch.Generator | None:
    if params.seed is None:
        return fallback
    return torch.Generator(device=device).manual_seed(position_seed(params.seed, pos))


def _categorical(weights: torch.Tensor, g: torch.Generator | None) -> int:
    """One draw from unnormalised non-negative weights [V]."""
    return int(torch.multinomial(weights / weights.sum(), 1, generator=g).item())
