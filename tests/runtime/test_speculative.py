"""n-gram speculative decoding: greedy equals plain decoding; sampling keeps the distribution."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from pdserve.core.sampling import SamplingParams
from pdserve.core.speculative import SpecStats, SpeculativeConfig
from pdserve.model.spec import ModelSpec
from pdserve.runtime.offline import generate
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_offline import generate_speculative
from pdserve.runtime.spec_verify import verify_drafts

SPEC = ModelSpec.from_config_dict(dict(
    model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=40, max_position_embeddings=256,
))
CFG = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=3)


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(SPEC, None, num_blocks=8000, block_size=8, load_format="dummy", seed=3)


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z=3.09: p = 0.001)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def homogeneity_chi2(a: Counter, b: Counter, min_count: int = 10) -> tuple[float, int]:
    """Two-sample chi-square statistic and degrees of freedom (rare bins lumped together)."""
    keys = sorted(set(a) | set(b))
    big = [t for t in keys if a[t] + b[t] >= min_count]
    rows = [(a[t], b[t]) for t in big] + [(sum(a[t] for t in keys if t not in big),
                                           sum(b[t] for t in keys if t not in big))]
    rows = [r for r in rows if sum(r)]
    na, nb = sum(r[0] for r in rows), sum(r[1] for r in rows)
    stat = 0.0
    for x, y in rows:
        ea, eb = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    return stat, len(rows) - 1


def test_greedy_speculation_equals_plain_decoding(runner: ModelRunner) -> None:
    prompts = [[1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2], [7] * 12, [9, 8, 7, 9, 8], [11]]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = generate(runner, prompts, params)
    stats = SpecStats()
    spec = generate_speculative(runner, prompts, params, CFG, stats=stats)
    assert spec == plain
    assert stats.accepted > 0, stats
    assert stats.emitted > stats.steps  # some steps produced more than one token


def test_greedy_speculation_with_stop_tokens(runner: ModelRunner) -> None:
    prompts = [[1, 2, 3, 1, 2, 3, 1], [5, 6, 5, 6, 5]]
    free = generate(runner, prompts, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    eos = free[0][10]
    params = SamplingParams(temperature=0.0, max_tokens=30, min_tokens=3)
    assert generate_speculative(runner, prompts, params, CFG, (eos,)) == generate(
        runner, prompts, params, (eos,)
    )


def test_verify_drafts_distribution_is_exact() -> None:
    """Unit level: the first emitted token of verify_drafts follows p (vocab 320)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 320) * 2.5
    params = SamplingParams(temperature=1.0)
    p = logits[0].softmax(-1)
    draft = int(p.argsort()[-3])  # a likely but not the likeliest token
    g = torch.Generator().manual_seed(1)
    n = 6000
    got = Counter(verify_drafts(logits, [draft], params, 5, ((), ()), g)[0] for _ in range(n))
    expected = Counter({t: 0 for t in range(320)})
    ref = torch.multinomial(p, n, replacement=True, generator=torch.Generator().manual_seed(2))
    expected.update(ref.tolist())
    stat, df = homogeneity_chi2(got, expected)
    assert stat < chi2_critical(df), (stat, df)


def test_sampling_distribution_unchanged_end_to_end(runner: ModelRunner) -> None:
    """Over many unseeded draws, the second output token (the first one verified against a
    draft) has the same distribution with and without speculation (chi-square, p=0.001)."""
    prompt = list(range(40)) * 2  # every token has an earlier occurrence: drafts at step two
    params = SamplingParams(temperature=0.8, max_tokens=3, ignore_eos=True)
    plain, spec, stats = Counter(), Counter(), SpecStats()
    for _ in range(3):
        plain.update(o[1] for o in generate(runner, [prompt] * 400, params))
        spec.update(o[1] for o in generate_speculative(runner, [prompt] * 400, params, CFG, stats=stats))
    assert stats.proposed > 0 and stats.accepted > 0, stats
    stat, df = homogeneity_chi2(plain, spec)
    assert stat < chi2_critical(df), (stat, df)


def test_offline_speculation_refuses_a_draft_model(runner: ModelRunner) -> None:
    cfg = SpeculativeConfig(method="draft_model", model="/m/draft")
    with pytest.raises(ValueError, match="n-gram lookup only, not 'draft_model'"):
        generate_speculative(runner, [[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=2), cfg)
