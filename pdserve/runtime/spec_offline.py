"""Offline generation with n-gram speculative decoding (test oracle and benchmark driver).

Continuous batching in miniature: all prompts are prefilled in one step, then every step
carries each live sequence's last token plus the drafts its proposer offers (possibly none);
sequences advance by different numbers of tokens and leave the batch as they finish.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.core.sampling import SamplingParams
from pdserve.core.speculative import NgramProposer, SpecStats, SpeculativeConfig
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.runtime.offline import _allocate
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_step import SpecSlice, execute_speculative


def generate_speculative(
    runner: ModelRunner,
    prompts: list[list[int]],
    params: SamplingParams,
    cfg: SpeculativeConfig,
    eos_token_ids: Sequence[int] = (),
    stats: SpecStats | None = None,
) -> list[list[int]]:
    """Like offline.generate, with speculation; `stats` (if given) collects acceptance counts."""
    params.validate()
    stats = stats if stats is not None else SpecStats()
    k = cfg.num_speculative_tokens
    # room for drafts past the last kept token: their KV is written, then overwritten
    tables = _allocate(runner, [len(p) + params.max_tokens + k for p in prompts])
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    suppress = tuple(sorted(stops))
    outs: list[list[int]] = [[] for _ in prompts]
    props = [NgramProposer(cfg) for _ in prompts]
    for p, prompt in zip(props, prompts):
        p.extend(prompt)
    first = StepInput(tuple(
        SeqSlice(str(i), tuple(p), 0, tables[i], params, True, suppress if params.min_tokens else ())
        for i, p in enumerate(prompts)
    ))
    for i, t in runner.execute(first).sampled.items():
        _emit(outs[int(i)], props[int(i)], [t], params, stops)
    live = [i for i in range(len(prompts)) if not _done(outs[i], params, stops)]
    while live:
        slices = [_spec_slice(i, prompts[i], outs[i], props[i], tables[i], params, suppress)
                  for i in live]
        emitted = execute_speculative(runner, slices)
        for s in slices:
            i, toks = int(s.slice.request_id), emitted[s.slice.request_id]
            accepted = len(toks) - 1
            props[i].feedback(s.num_drafts, accepted)
            stats.record(s.num_drafts, accepted)
            _emit(outs[i], props[i], toks, params, stops)
        live = [i for i in live if not _done(outs[i], params, stops)]
    return outs


def _spec_slice(
    i: int, prompt: list[int], out: list[int], prop: NgramProposer, table: tuple[int, ...],
    params: SamplingParams, suppress: tuple[int, ...],
) -> SpecSlice:
    """Last token + drafts (never more than the tokens still allowed after this step's one)."""
    drafts = prop.propose(limit=params.max_tokens - len(out) - 1)
    start = len(prompt) + len(out) - 1
    rows = tuple(suppress if len(out) + r < params.min_tokens else () for r in range(len(drafts) + 1))
    sl = SeqSlice(str(i), (out[-1], *drafts), start, table, params, True, rows[0])
    return SpecSlice(sl, len(drafts), rows)


def _emit(out: list[int], prop: NgramProposer, toks: list[int], params: SamplingParams,
          stops: set[int]) -> None:
    """Append tokens up to max_tokens and the first stop token (kept, like offline.generate)."""
    for t in toks:
        if _done(out, params, stops):
            return
        out.append(t)
        prop.extend([t])


def _done(out: list[int], params: SamplingParams, stops: set[int]) -> bool:
    return len(out) >= params.max_tokens or bool(out and out[-1] in stops and len(out) >= params.min_tokens)
