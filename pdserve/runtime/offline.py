"""A minimal single-process generator: the test oracle and `pdserve generate --offline`."""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import History, SeqSlice, StepInput
from pdserve.guided import GuideCompiler, make_guide
from pdserve.runtime.runner import ModelRunner


def generate(
    runner: ModelRunner,
    prompts: list[list[int]],
    params: SamplingParams,
    eos_token_ids: Sequence[int] = (),
    guides: GuideCompiler | None = None,
) -> list[list[int]]:
    """Generate for every prompt: one batched prefill step, then batched decode steps.

    A sequence ends after max_tokens, or on an EOS id (unless ignore_eos) or a stop token id,
    which is kept as its last token; before min_tokens those ids are suppressed. With
    params.guide (compiled by `guides`) every sampled token keeps to it. Blocks are handed out
    as disjoint contiguous ranges; ValueError if they do not fit in the pool.
    """
    params.validate()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    longest = max(len(p) for p in prompts) + params.max_tokens - 1
    if longest > runner.max_model_len:
        raise ValueError(f"prompt + max_tokens needs {longest} positions, the runner has {runner.max_model_len}")
    tables = _allocate(runner, [len(p) + params.max_tokens for p in prompts])
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    suppress = tuple(sorted(stops))
    outs: list[list[int]] = [[] for _ in prompts]
    followed = [make_guide(guides, params) for _ in prompts]
    live = list(range(len(prompts)))
    slices = [
        SeqSlice(str(i), tuple(p), 0, tables[i], params, True, _suppress(outs[i], params, suppress),
                 history=History(p, outs[i], 0) if params.penalized else None)
        for i, p in enumerate(prompts)
    ]
    while live:
        for i, sl in zip(live, slices):
            if followed[i] is not None:
                sl.allowed = followed[i].allowed()
        sampled = runner.execute(StepInput(tuple(slices))).sampled
        for i in live:
            outs[i].append(sampled[str(i)])
            if followed[i] is not None and not followed[i].accept(outs[i][-1]):
                raise RuntimeError(f"prompt {i}: token {outs[i][-1]} leaves the guide")
        live = [i for i in live if len(outs[i]) < params.max_tokens and outs[i][-1] not in stops]
        slices = [_decode(str(i), prompts[i], outs[i], tables[i], params, suppress) for i in live]
    return outs


def _decode(rid: str, prompt: list[int], out: list[int], table: tuple[int, ...], params: SamplingParams,
            stops: tuple[int, ...]) -> SeqSlice:
    """The decode slice of a sequence's newest token (with its history when penalized)."""
    start = len(prompt) + len(out) - 1
    return SeqSlice(rid, (out[-1],), start, table, params, True, _suppress(out, params, stops),
                    history=History(prompt, out, start) if params.penalized else None)


def _suppress(out: list[int], params: SamplingParams, stops: tuple[int, ...]) -> tuple[int, ...]:
    return stops if len(out) < params.min_tokens else ()


def _allocate(runner: ModelRunner, lengths: list[int]) -> list[tuple[int, ...]]:
    """Contiguous disjoint block ranges covering each sequence's final length."""
    bs, next_block, tables = runner.block_size, 0, []
    for n in lengths:
        need = -(-n // bs)
        tables.append(tuple(range(next_block, next_block + need)))
        next_block += need
    if next_block > runner.num_blocks:
        raise ValueError(f"prompts need {next_block} KV blocks, the pool has {runner.num_blocks}")
    return tables
