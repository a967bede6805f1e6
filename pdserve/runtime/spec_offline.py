"""Offline generation with n-gram speculative decoding (test oracle and benchmark driver).

Continuous batching in miniature: all prompts are prefilled in one step, then every step
carries each live sequence's last token plus the drafts its proposer offers (possibly none);
sequences advance by different numbers of tokens and leave the batch as they finish.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.core.request import Sequence as Seq
from pdserve.core.sampling import SamplingParams
from pdserve.core.spec_schedule import draft_limit
from pdserve.core.spec_gate import BatchGate
from pdserve.core.speculative import NgramProposer, SpecStats, SpeculativeConfig
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.runtime.offline import _allocate
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_step import SpeculativeRunner, execute_speculative


def generate_speculative(
    runner: ModelRunner,
    prompts: list[list[int]],
    params: SamplingParams,
    cfg: SpeculativeConfig | None,
    eos_token_ids: Sequence[int] = (),
    stats: SpecStats | None = None,
    verifier: SpeculativeRunner | None = None,
) -> list[list[int]]:
    """Like offline.generate, with speculation; `stats` (if given) collects acceptance counts.
    cfg None: the same loop without drafts (plain decoding, a like-for-like baseline).
    `verifier` (a SpeculativeRunner over `runner`, e.g. with verify graphs) runs the steps."""
    params.validate()
    if cfg is not None and cfg.method != "ngram":  # never a silent n-gram run in its place
        raise ValueError(f"generate_speculative runs n-gram lookup only, not {cfg.method!r}; a draft model "
                         "runs through the serving scheduler (core/spec_schedule.DraftPlanner)")
    stats = stats if stats is not None else SpecStats()
    k = cfg.num_speculative_tokens if cfg is not None else 0
    # room for drafts past the last kept token: their KV is written, then overwritten
    tables = _allocate(runner, [len(p) + params.max_tokens + k for p in prompts])
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    suppress = tuple(sorted(stops))
    outs: list[list[int]] = [[] for _ in prompts]
    props = [NgramProposer(cfg or SpeculativeConfig()) for _ in prompts]
    for p, prompt in zip(props, prompts):
        p.extend(prompt)
    first = StepInput(tuple(
        SeqSlice(str(i), tuple(p), 0, tables[i], params, True, suppress if params.min_tokens else ())
        for i, p in enumerate(prompts)
    ))
    for i, t in runner.execute(first).sampled.items():
        _emit(outs[int(i)], props[int(i)], [t], params, stops)
    live = [i for i in range(len(prompts)) if not _done(outs[i], params, stops)]
    gate = BatchGate()
    while live:
        step_k = k if gate.allow(len(live)) else 0
        slices = [_spec_slice(i, prompts[i], outs[i], props[i], tables[i], params, suppress, step_k,
                              runner.max_model_len) for i in live]
        step = StepInput(tuple(slices))
        out = verifier.execute(step) if verifier is not None else execute_speculative(runner, step)
        proposed = kept = 0
        for s in slices:
            i = int(s.request_id)
            toks = out.emitted[s.request_id] if s.num_drafts else (out.sampled[s.request_id],)
            accepted = len(toks) - 1
            props[i].feedback(s.num_drafts, accepted)
            stats.record(s.num_drafts, accepted)
            proposed += s.num_drafts
            kept += accepted
            _emit(outs[i], props[i], toks, params, stops)
        gate.record(proposed, kept)
        live = [i for i in live if not _done(outs[i], params, stops)]
    return outs


def _spec_slice(
    i: int, prompt: list[int], out: list[int], prop: NgramProposer, table: tuple[int, ...],
    params: SamplingParams, suppress: tuple[int, ...], k: int, max_len: int,
) -> SeqSlice:
    """Last token + drafts, bounded as in the serving scheduler (core/spec_schedule.py)."""
    limit = draft_limit(Seq(str(i), prompt, params, output_ids=out), k, max_len) if k else 0
    drafts = prop.propose(limit=limit) if limit > 0 else ()
    start = len(prompt) + len(out) - 1
    rows = suppress if len(out) < params.min_tokens else ()
    return SeqSlice(str(i), (out[-1], *drafts), start, table, params, True, rows, len(drafts))


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
