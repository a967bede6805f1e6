"""Temperature sampling split over programs against its distribution (softmax(x / T)) and
against the one-program-per-row kernel, which must draw the same token for the same seed."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, chi2_999, chi_square  # noqa: E402

from pdserve.kernels.sample import sample_top_p  # noqa: E402
from pdserve.kernels.sample_temperature import MAX_CHUNKS, chunk_size, sample_temperature  # noqa: E402

ON_GPU = str(DEVICE).startswith("cuda")
DRAWS = 20000 if ON_GPU else 400  # the interpreter runs ~150 programs a second


def _temps(n: int, t: float) -> torch.Tensor:
    return torch.full((n,), t, dtype=torch.float32, device=DEVICE)


def _seeds(n: int, first: int = 0) -> torch.Tensor:
    return torch.arange(first, first + n, dtype=torch.int64, device=DEVICE)


@pytest.mark.parametrize(("temp", "v", "block", "chunk"), [(1.0, 37, 16, 16), (0.5, 37, 64, None), (1.7, 50, 64, None)])
def test_draws_follow_softmax_over_temperature(temp: float, v: int, block: int, chunk: int | None) -> None:
    """DRAWS rows of the same logits (a tie included) with seeds 0..DRAWS-1, the row in 3 chunks
    or 1 (test_same_token_as_the_row_kernel_whatever_the_split covers the others): the tokens'
    counts against softmax(x / T) (chi-square at the 0.1 % level)."""
    logits = (torch.randn(v, generator=torch.Generator().manual_seed(5)) * 2).to(DEVICE)
    logits[[4, 9]] = logits[7].item()
    tokens = sample_temperature(logits.expand(DRAWS, v), _temps(DRAWS, temp), _seeds(DRAWS), block=block, chunk=chunk)
    stat, df = chi_square(tokens, (logits.float() / temp).softmax(-1))
    assert stat < chi2_999(df), (stat, df)


@pytest.mark.parametrize(("v", "block", "chunk"), [(100, 16, 16), (100, 16, 48), (100, 64, 64), (333, 32, 96)])
def test_same_token_as_the_row_kernel_whatever_the_split(v: int, block: int, chunk: int) -> None:
    """The token of each seed equals sample_top_p's at top_p 1 (one program per row, its own
    tiling) for rows split into 1-11 chunks of 1-3 tiles: the noise of a token depends on the
    seed and its index only."""
    n = 24
    logits = torch.randn(n, v, device=DEVICE) * 3
    temps = torch.rand(n, generator=torch.Generator().manual_seed(1)).to(DEVICE) + 0.3
    seeds = _seeds(n, 1000)
    split = sample_temperature(logits, temps, seeds, block=block, chunk=chunk)
    whole = sample_top_p(logits, temps, torch.ones(n, device=DEVICE), seeds)
    assert split.tolist() == whole.tolist()
    assert split.unique().numel() > 3


def test_seed_fixes_the_token_whatever_the_batch() -> None:
    """A row alone, in a batch or in another order gives the same token; other seeds, others."""
    logits = torch.randn(5, 300, device=DEVICE) * 2
    temps = torch.tensor([1.0, 0.8, 1.3, 0.6, 1.0], device=DEVICE)
    seeds = torch.tensor([11, 12, 13, 14, 15], dtype=torch.int64, device=DEVICE)
    full = sample_temperature(logits, temps, seeds)
    for r in range(5):
        assert sample_temperature(logits[r:r + 1], temps[r:r + 1], seeds[r:r + 1]).item() == full[r].item()
    perm = torch.tensor([4, 2, 0, 3, 1], device=DEVICE)
    assert (sample_temperature(logits[perm], temps[perm], seeds[perm]) == full[perm]).all()
    many = sample_temperature(logits[:1].expand(64, 300), _temps(64, 1.0), _seeds(64))
    assert many.unique().numel() > 1


def test_masked_tokens_bf16_and_all_masked_rows() -> None:
    """-inf logits are never drawn, in fp32 and bf16; a row of -inf only gives token 0; a tiny
    temperature gives an argmax."""
    logits = torch.randn(6, 200, device=DEVICE)
    logits[:, ::2] = float("-inf")
    logits[5] = float("-inf")
    temps = _temps(6, 1.0)
    temps[3:5] = 1e-4
    for x in (logits, logits.to(torch.bfloat16)):
        tokens = sample_temperature(x, temps, _seeds(6), block=16, chunk=64).tolist()
        assert all(t % 2 == 1 for t in tokens[:5]), tokens
        # an argmax: bf16 rounding can tie two logits (seed 3762508846 tied 2.482 and 2.487
        # at 2.484 in row 4), and either is the argmax then
        assert all(x[r, tokens[r]] == x[r].max() for r in (3, 4)), tokens
        assert tokens[5] == 0


def test_chunk_size_keeps_chunks_bounded() -> None:
    """Whole tiles per chunk, at least 8192 tokens, at most MAX_CHUNKS chunks, and no more
    tiles than either needs."""
    for block in (512, 1024, 16384):
        for v in (1, 37, 1024, 1025, 32000, 128256, 152064, 10**6, 10**7):
            c = chunk_size(v, block)
            assert c % block == 0 and c >= 8192 and -(-v // c) <= MAX_CHUNKS, (v, block, c)
            assert c - block < 8192 or -(-v // (c - block)) > MAX_CHUNKS, (v, block, c)


def test_bad_inputs_name_the_field() -> None:
    logits = torch.randn(2, 10, device=DEVICE)
    temps, seeds = _temps(2, 1.0), _seeds(2)
    with pytest.raises(AssertionError, match="seeds"):
        sample_temperature(logits, temps, seeds.int())
    with pytest.raises(AssertionError, match="temperature"):
        sample_temperature(logits, temps[:1], seeds)
    with pytest.raises(AssertionError, match="logits"):
        sample_temperature(logits[:, ::2], temps, seeds)
    with pytest.raises(AssertionError, match="chunk"):
        sample_temperature(logits, temps, seeds, block=16, chunk=24)
    with pytest.raises(AssertionError, match="block"):
        sample_temperature(logits, temps, seeds, block=24)
    assert sample_temperature(logits[:0], temps[:0], seeds[:0]).shape == (0,)
