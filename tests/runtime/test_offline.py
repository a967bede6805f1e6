"""Offline generate: batching, EOS, stop ids, min_tokens, pool bounds."""

from __future__ import annotations

import pytest

from pdserve.core.sampling import SamplingParams
from pdserve.model.spec import ModelSpec
from pdserve.runtime.offline import generate
from pdserve.runtime.runner import ModelRunner

SPEC = ModelSpec.from_config_dict(dict(
    model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16,
    num_attention_heads=4, num_key_value_heads=1, vocab_size=40, max_position_embeddings=256,
))
PROMPTS = [[1, 2, 3], [4] * 20, [7]]


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(SPEC, None, num_blocks=40, block_size=8, load_format="dummy", seed=1)


def _free_run(runner: ModelRunner) -> list[list[int]]:
    return generate(runner, PROMPTS, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), (0,))


def test_batched_equals_one_by_one(runner: ModelRunner) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    batched = _free_run(runner)
    assert [len(o) for o in batched] == [20, 20, 20]
    assert batched == [generate(runner, [p], params)[0] for p in PROMPTS]


def test_eos_stops_and_is_kept(runner: ModelRunner) -> None:
    free = _free_run(runner)
    eos = free[1][4]
    got = generate(runner, PROMPTS, SamplingParams(temperature=0.0, max_tokens=20), (eos,))
    for f, g in zip(free, got):
        cut = f.index(eos) + 1 if eos in f else len(f)
        assert g == f[:cut]
    ignored = generate(runner, PROMPTS, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), (eos,))
    assert ignored == free


def test_stop_token_ids_and_min_tokens(runner: ModelRunner) -> None:
    free = _free_run(runner)
    stop = free[0][0]
    got = generate(runner, PROMPTS, SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=(stop,)))
    assert got[0] == [stop]
    held = generate(runner, PROMPTS, SamplingParams(temperature=0.0, max_tokens=20, min_tokens=6,
                                                    stop_token_ids=(stop,)))
    for toks in held:
        assert stop not in toks[:6]
        assert len(toks) == 20 or toks[-1] == stop


def test_pool_too_small() -> None:
    small = ModelRunner(SPEC, None, num_blocks=3, block_size=8, load_format="dummy")
    with pytest.raises(ValueError, match="KV blocks"):
        generate(small, PROMPTS, SamplingParams(max_tokens=8))


def test_too_long_for_the_model(runner: ModelRunner) -> None:
    with pytest.raises(ValueError, match="positions"):
        generate(runner, [[1] * 200], SamplingParams(max_tokens=100))
