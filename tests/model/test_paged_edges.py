"""Paged KV at block edges, shuffled block tables and chunked prefill, against transformers."""

from __future__ import annotations

import random

import pytest
import torch
from model.hf_tiny import hf_greedy_model, hf_model, tiny_model  # noqa: F401 (fixture)

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner

LENGTHS = (1, 15, 16, 17, 300)
NEW = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW)


def _greedy_paged(
    runner: ModelRunner, prompts: list[list[int]], tables: list[tuple[int, ...]], chunk: int
) -> list[list[int]]:
    """Greedy decoding driven slice by slice: prompts are prefilled `chunk` tokens per step
    (non-final chunks do not sample), all sequences share every step."""
    done = [0] * len(prompts)  # prompt tokens already in the cache
    outs: list[list[int]] = [[] for _ in prompts]
    while any(len(o) < NEW for o in outs):
        slices = []
        for i, p in enumerate(prompts):
            if done[i] < len(p):
                ids = p[done[i] : done[i] + chunk]
                slices.append(SeqSlice(str(i), tuple(ids), done[i], tables[i], GREEDY,
                                       sample=done[i] + len(ids) == len(p)))
                done[i] += len(ids)
            elif len(outs[i]) < NEW:
                start = len(p) + len(outs[i]) - 1
                slices.append(SeqSlice(str(i), (outs[i][-1],), start, tables[i], GREEDY))
        for rid, tok in runner.execute(StepInput(tuple(slices))).sampled.items():
            outs[int(rid)].append(tok)
    return outs


@pytest.mark.parametrize("shuffle,chunk", [(False, 10_000), (True, 10_000), (True, 64)])
def test_block_edges_match_transformers(tiny_model, shuffle: bool, chunk: int) -> None:
    folder = tiny_model("llama")
    spec = ModelSpec.from_dir(folder)
    bs = 16
    need = [-(-(n + NEW) // bs) for n in LENGTHS]
    num_blocks = sum(need) + 7
    ids = list(range(num_blocks))
    if shuffle:
        random.Random(3).shuffle(ids)
    tables, at = [], 0
    for n in need:
        # A couple of spare trailing blocks: tables may be longer than what is used.
        tables.append(tuple(ids[at : at + n + 1]))
        at += n + 1
    runner = ModelRunner(spec, folder, num_blocks=num_blocks, block_size=bs)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, spec.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]
    ours = _greedy_paged(runner, prompts, tables, chunk)
    model = hf_model(folder)
    assert ours == [hf_greedy_model(model, p, NEW) for p in prompts]
