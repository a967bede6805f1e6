"""Sort-free temperature / top-p sampling against the distribution of its reference twin."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, chi2_999, chi_square  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.sample import sample_top_p  # noqa: E402

V = 37  # not a tile multiple: two tiles of 32 with block=32, one partial tile at the default
ON_GPU = str(DEVICE).startswith("cuda")
DRAWS = 20000 if ON_GPU else 500  # the interpreter runs ~30 programs a second
CASES = [(1.0, 1.0, 4096), (0.7, 0.8, 4096), (1.5, 0.5, 32), (1.0, 0.95, 32)]


def _rows(n: int, temp: float, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.full((n,), temp, dtype=torch.float32, device=DEVICE),
            torch.full((n,), p, dtype=torch.float32, device=DEVICE))


@pytest.mark.parametrize(("temp", "p", "block"), CASES if ON_GPU else CASES[1:3])
def test_draws_follow_the_reference_distribution(temp: float, p: float, block: int) -> None:
    """DRAWS rows of the same logits with seeds 0..DRAWS-1: the tokens' counts against
    reference.top_p_probs (chi-square at the 0.1 % level), none outside the nucleus."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(V, generator=g) * 2).to(DEVICE)
    logits[[4, 9]] = logits[7].item()  # a tie: kept or dropped together
    temps, ps = _rows(DRAWS, temp, p)
    seeds = torch.arange(DRAWS, dtype=torch.int64, device=DEVICE)
    rounds = torch.zeros(DRAWS, dtype=torch.int32, device=DEVICE)
    tokens = sample_top_p(logits.expand(DRAWS, V), temps, ps, seeds, block=block, rounds=rounds)
    probs = reference.top_p_probs(logits[None], temps[:1], ps[:1])[0]
    assert (probs[tokens.cpu()] > 0).all(), "a token outside the nucleus was drawn"
    stat, df = chi_square(tokens, probs)
    assert stat < chi2_999(df), (stat, df)
    assert rounds.min() >= 1 and rounds.float().mean() <= 1 / p + 0.5, rounds.float().mean()


def test_seed_fixes_the_token_whatever_the_batch() -> None:
    """A row's token depends on its logits, settings and seed only: the same row alone, among
    other rows or in another order gives the same token; other seeds give others."""
    logits = torch.randn(6, 300, device=DEVICE) * 2
    temps = torch.tensor([1.0, 0.8, 1.0, 0.6, 1.2, 1.0], device=DEVICE)
    ps = torch.tensor([0.9, 1.0, 0.7, 0.95, 0.5, 1.0], device=DEVICE)
    seeds = torch.tensor([11, 12, 13, 14, 15, 16], dtype=torch.int64, device=DEVICE)
    full = sample_top_p(logits, temps, ps, seeds)
    for r in range(6):
        alone = sample_top_p(logits[r:r + 1].contiguous(), temps[r:r + 1], ps[r:r + 1], seeds[r:r + 1])
        assert alone.item() == full[r].item()
    perm = torch.tensor([5, 3, 1, 0, 4, 2], device=DEVICE)
    assert (sample_top_p(logits[perm], temps[perm], ps[perm], seeds[perm]) == full[perm]).all()
    many = sample_top_p(logits[:1].expand(64, 300), temps[:1].expand(64).contiguous(), ps[:1].expand(64).contiguous(),
                        torch.arange(64, dtype=torch.int64, device=DEVICE))
    assert many.unique().numel() > 1


def test_masked_tokens_tiny_top_p_and_bf16() -> None:
    """-inf logits are never drawn; top_p so small that only the most likely token stays gives
    it (or one of several equally likely: bf16 rounding can tie the top logits, and tied tokens
    stay in the nucleus together); bf16 logits are read as they are."""
    logits = torch.randn(8, 200, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    logits[:, ::2] = float("-inf")
    temps, ps = _rows(8, 1.0, 0.9)
    ps[4:] = 1e-7
    for x in (logits, logits.to(torch.bfloat16)):
        tokens = sample_top_p(x, temps, ps, torch.arange(8, dtype=torch.int64, device=DEVICE))
        assert (tokens % 2 == 1).all(), tokens
        top = x[4:].float()
        assert (top.gather(1, tokens[4:, None]) == top.max(dim=-1, keepdim=True).values).all(), tokens


def test_row_of_masked_logits_only_gives_token_zero() -> None:
    """Every logit -inf (all ids suppressed): token 0, as the sorted path's argmax gives, with
    and without top-p, and no read past the row."""
    logits = torch.full((2, 40), float("-inf"), device=DEVICE)
    temps, ps = _rows(2, 1.0, 0.9)
    ps[1] = 1.0
    tokens = sample_top_p(logits, temps, ps, torch.arange(2, dtype=torch.int64, device=DEVICE), max_rounds=3)
    assert tokens.tolist() == [0, 0]


def test_round_cap_returns_the_most_likely_token() -> None:
    """With one round allowed, a rejected draw falls back to the row's argmax: flat logits and
    top_p 0.01, where a first draw lands outside the nucleus almost always."""
    logits = torch.zeros(16, 500, device=DEVICE)
    logits[:, 123] = 0.5
    temps, ps = _rows(16, 1.0, 0.001)
    rounds = torch.zeros(16, dtype=torch.int32, device=DEVICE)
    tokens = sample_top_p(logits, temps, ps, torch.arange(16, dtype=torch.int64, device=DEVICE), max_rounds=1,
                          rounds=rounds)
    assert (tokens == 123).all() and (rounds == 1).all()


def test_bad_inputs_name_the_field() -> None:
    logits = torch.randn(2, 10, device=DEVICE)
    temps, ps = _rows(2, 1.0, 0.9)
    seeds = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(AssertionError, match="seeds"):
        sample_top_p(logits, temps, ps, seeds.int())
    with pytest.raises(AssertionError, match="top_p"):
        sample_top_p(logits, temps, ps[:1], seeds)
    with pytest.raises(AssertionError, match="logits"):
        sample_top_p(logits[:, ::2], temps, ps, seeds)


def test_sampler_routes_rows_without_top_k_to_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime.sampler with the kernels allowed on this device: in a batch of greedy, top-k,
    seeded top-p and temperature-only rows, each top-p row gets sample_top_p's token for its own
    seed and each temperature row sample_temperature's (the same as alone), greedy rows their
    argmax, the top-k row a token of its top k."""
    from pdserve.core.sampling import SamplingParams
    from pdserve.kernels.sample_temperature import sample_temperature
    from pdserve.runtime import sampler

    rule = sampler._kernel_draw  # the sampler's own rule, as on a CUDA device
    monkeypatch.setattr(sampler, "_kernel_draw", lambda p, vocab, device: rule(p, vocab, torch.device("cuda")))
    logits = torch.randn(6, 60, device=DEVICE) * 2
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.7, seed=3),
              SamplingParams(temperature=1.0, top_k=3), SamplingParams(temperature=1.0, top_p=0.9, seed=9),
              SamplingParams(temperature=1.0), SamplingParams(temperature=0.6, seed=5)]
    got = sampler.sample_tokens(logits, params, [4, 5, 6, 7, 8, 9])
    for r in (1, 3, 5):
        key = torch.tensor([sampler.position_seed(params[r].seed, r + 4)], device=DEVICE)
        temp, p = _rows(1, params[r].temperature, params[r].top_p)
        want = sample_top_p(logits[r:r + 1], temp, p, key) if r < 5 else sample_temperature(logits[r:r + 1], temp, key)
        assert got[r] == want.item()
        assert sampler.sample_tokens(logits[r:r + 1], [params[r]], [r + 4]) == [got[r]]
    assert got[0] == logits[0].argmax().item()
    assert got[2] in logits[2].topk(3).indices.tolist()
    assert 0 <= got[4] < 60
