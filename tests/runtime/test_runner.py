"""ModelRunner on dummy weights: validation, layer hook, KV layout, seeded sampling across steps."""

from __future__ import annotations

import pytest
import torch

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.model.spec import ModelSpec
from pdserve.runtime.kv_cache import allocate_kv_pool, block_bytes, kv_layout, num_blocks_for_bytes
from pdserve.runtime.runner import ModelRunner

SPEC = ModelSpec.from_config_dict(dict(
    model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
))
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(SPEC, None, num_blocks=16, block_size=4, load_format="dummy", seed=0)


def test_pool_and_layout(runner: ModelRunner) -> None:
    assert runner.kv_pool.shape == (3, 2, 16, 4, 2, 16)
    lay = runner.layout
    assert (lay.num_layers, lay.num_kv_heads, lay.head_dim, lay.block_size, lay.dtype, lay.order) == (
        3, 2, 16, 4, "float32", "LKNSHD")
    assert kv_layout(SPEC, 4, torch.bfloat16).compat_hash() != lay.compat_hash()
    assert block_bytes(SPEC, 4, torch.float32) == runner.kv_pool[:, :, 0].numel() * 4
    assert num_blocks_for_bytes(SPEC, 4, torch.float32, 10 * block_bytes(SPEC, 4, torch.float32) + 5) == 10
    with pytest.raises(ValueError):
        num_blocks_for_bytes(SPEC, 4, torch.float32, 100)
    assert allocate_kv_pool(SPEC, 2, 8, torch.bfloat16).shape == (3, 2, 2, 8, 2, 16)


@pytest.mark.parametrize("bad,match", [
    (SeqSlice("a", (1, 2, 3, 4, 5), 0, (0,), GREEDY), "need 2"),
    (SeqSlice("a", (1,), 4, (0, 99), GREEDY), "outside the pool"),
    (SeqSlice("a", (1, 300), 0, (0,), GREEDY), "vocabulary"),
    (SeqSlice("a", (1,), 256, tuple(range(16)) * 5, GREEDY), "positions"),
])
def test_invalid_slices_are_refused(runner: ModelRunner, bad: SeqSlice, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        runner.execute(StepInput((bad,)))


def test_duplicate_request_refused(runner: ModelRunner) -> None:
    s = SeqSlice("a", (1,), 0, (0,), GREEDY)
    with pytest.raises(ValueError, match="twice"):
        runner.execute(StepInput((s, s)))


def test_layer_hook_sees_each_layer_written_in_order() -> None:
    r = ModelRunner(SPEC, None, num_blocks=4, block_size=4, load_format="dummy")
    seen: list[int] = []

    def hook(layer: int) -> None:
        # Layer `layer` holds the new tokens' KV (block 2, 3 slots); later layers not yet.
        assert r.kv_pool[layer, :, 2, :3].abs().sum() > 0
        assert r.kv_pool[layer + 1 :, :, 2].abs().sum() == 0
        seen.append(layer)

    out = r.execute(StepInput((SeqSlice("x", (5, 6, 7), 0, (2,), GREEDY),)), layer_hook=hook)
    assert seen == [0, 1, 2] and set(out.sampled) == {"x"}


def test_non_sampling_slice_returns_nothing(runner: ModelRunner) -> None:
    out = runner.execute(StepInput((SeqSlice("c", (1, 2, 3), 0, (5,), GREEDY, sample=False),)))
    assert out.sampled == {}


def _seeded_run(runner: ModelRunner, prompt: list[int], n: int, split: int, extra: bool) -> list[int]:
    """Sample n tokens with seed 11: the first `split` by prefill+decode, then the prompt plus
    those tokens is prefilled again (as a decode worker would receive it) and decoding goes on.
    `extra` adds an unrelated request to every step."""
    p = SamplingParams(temperature=1.0, seed=11)
    noise = SamplingParams(temperature=1.0)
    table = tuple(range(8))
    out: list[int] = []
    ids, start = list(prompt), 0
    while len(out) < n:
        if len(out) == split:
            ids, start = prompt + out, 0  # re-prefill everything from scratch
        seqs = [SeqSlice("s", tuple(ids), start, table, p)]
        if extra:
            seqs.append(SeqSlice("o", (len(out) % 7 + 1,) * 3, 0, (8 + len(out) % 4,), noise))
        tok = runner.execute(StepInput(tuple(seqs))).sampled["s"]
        out.append(tok)
        start += len(ids)
        ids = [tok]
    return out


def test_seeded_tokens_independent_of_worker_and_batch(runner: ModelRunner) -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    base = _seeded_run(runner, prompt, 12, split=12, extra=False)
    assert _seeded_run(runner, prompt, 12, split=5, extra=True) == base
    assert _seeded_run(runner, prompt, 12, split=1, extra=False) == base
    assert len(set(base)) > 3


def test_bfloat16_runs_and_reports_its_layout() -> None:
    r = ModelRunner(SPEC, None, num_blocks=4, block_size=4, dtype=torch.bfloat16, load_format="dummy")
    assert r.kv_pool.dtype == torch.bfloat16 and r.layout.dtype == "bfloat16"
    out = r.execute(StepInput((SeqSlice("x", (5, 6, 7, 8, 9), 0, (1, 3), GREEDY),)))
    assert 0 <= out.sampled["x"] < SPEC.vocab_size


def test_warm_up_leaves_no_trace() -> None:
    """warm_up runs prefill, prefix and decode steps, then the runner behaves as a fresh one:
    same unseeded draws (its generator untouched), and a placeholder slice is refused as if
    no step had run."""
    def fresh() -> ModelRunner:
        return ModelRunner(SPEC, None, num_blocks=16, block_size=4, load_format="dummy", seed=3)

    warm = fresh()
    warm.warm_up()
    assert warm.penalty_counts._counts is None  # the penalties ran on scratch counts
    with pytest.raises(ValueError, match="did not sample"):
        warm.execute(StepInput((SeqSlice("w2", (-1,), 9, (6, 7, 8), GREEDY, prev_row=0),)))
    hot = SamplingParams(temperature=1.0, max_tokens=8)
    steps = [StepInput((SeqSlice("s", (5, 6, 7, 8, 9), 0, (9, 10), hot),))] + [
        StepInput((SeqSlice("s", (-1,), pos, (9, 10, 11), hot, prev_row=0),)) for pos in range(5, 9)]
    runs = []
    for r in (warm, fresh()):
        runs.append([r.execute(s).sampled["s"] for s in steps])
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 1  # temperature 1 over random weights: the draws do vary


def test_warm_up_skips_a_pool_too_small() -> None:
    r = ModelRunner(SPEC, None, num_blocks=8, block_size=4, load_format="dummy", seed=3)
    r.warm_up()
    assert not r.kv_pool.any()  # nothing ran
