"""Verification of draft tokens: rejection sampling that keeps the target distribution exact.

For a point-mass draft d (n-gram lookup), the standard rule accept-with-min(1, p/q) becomes
accept with probability p(d); on rejection the token is drawn from the residual max(p - q, 0)
renormalised, i.e. p with d removed. Greedy requests accept while the draft equals the argmax.
Seeded requests draw position p's uniform and residual from position_seed(seed, p).
`verify_step` does this for a whole serving step: slices without drafts are sampled as usual
and every greedy row is decided by one batched argmax (one device sync per step).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import SeqSlice, StepOutput
from pdserve.runtime.penalties import PenaltyCounts, process
from pdserve.runtime.sampler import position_seed, queue_logprobs, sample_on_device, token_probs


def verify_step(
    logits: torch.Tensor, seqs: Sequence[tuple[SeqSlice, int]], generator: torch.Generator | None,
    counts: PenaltyCounts | None = None,
) -> StepOutput:
    """Tokens of one step whose logits rows were computed for the sampled slices only.

    seqs: (slice, first row); a slice owns rows first .. first + num_drafts (row i predicts
    position end_pos - num_drafts + i). Slices with drafts land in StepOutput.emitted. counts:
    the runner's penalty counts (penalized slices have no drafts).
    """
    batched: list[tuple[SeqSlice, int, int]] = []  # (slice, first row, rows): one sampler call
    rows: list[int] = []
    emitted: dict[str, tuple[int, ...]] = {}
    for sl, first in seqs:
        n = sl.num_drafts + 1
        if sl.num_drafts and not sl.sampling.greedy:
            drafts = sl.token_ids[len(sl.token_ids) - sl.num_drafts :]
            emitted[sl.request_id] = tuple(verify_drafts(
                logits[first : first + n], drafts, sl.sampling, sl.end_pos - sl.num_drafts,
                (sl.suppress_token_ids,) * n, generator,
            ))
            continue
        batched.append((sl, len(rows), n))
        rows.extend(range(first, first + n))
    if not batched:
        return StepOutput(emitted=emitted)
    per_row = [(sl, sl.end_pos - n + 1 + i) for sl, _, n in batched for i in range(n)]
    params, batch = [sl.sampling for sl, _ in per_row], logits[rows]
    picked = sample_on_device(  # penalized slices have no drafts (draft_limit): one row each
        process(batch, [sl for sl, _ in per_row], None, counts), params, [pos for _, pos in per_row],
        [sl.suppress_token_ids for sl, _ in per_row], generator,
        [sl.allowed for sl, _ in per_row],  # guided slices have no drafts (draft_limit): one row each
    )
    queued = queue_logprobs(batch, picked, params)  # rows without drafts only (draft_limit)
    tokens = picked.tolist()
    logprobs = {} if queued is None else {per_row[r][0].request_id: e for r, e in zip(queued.rows, queued.entries())}
    sampled: dict[str, int] = {}
    for sl, at, n in batched:
        if sl.num_drafts:
            drafts = sl.token_ids[len(sl.token_ids) - sl.num_drafts :]
            emitted[sl.request_id] = tuple(accept_greedy(tokens[at : at + n], drafts))
        else:
            sampled[sl.request_id] = tokens[at]
    return StepOutput(sampled=sampled, emitted=emitted, logprobs=logprobs)


def verify_drafts(
    logits: torch.Tensor,
    drafts: Sequence[int],
    params: SamplingParams,
    first_pos: int,
    suppress: Sequence[Sequence[int]],
    generator: torch.Generator | None,
) -> list[int]:
    """Tokens emitted for one sequence: the accepted drafts plus one corrected/bonus token.

    logits [len(drafts) + 1, V] (any float dtype; upcast here): row i predicts position
    first_pos + i (row i > 0 follows draft i - 1). suppress[i]: ids masked in row i.
    """
    logits = logits.float().clone()
    for i, ids in enumerate(suppress):
        if ids:
            logits[i, list(ids)] = float("-inf")
    if params.greedy:
        return accept_greedy(logits.argmax(dim=-1).tolist(), drafts)
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


def accept_greedy(target: Sequence[int], drafts: Sequence[int]) -> list[int]:
    """The longest prefix of drafts matching target, then target's next token."""
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
