"""Triton apply_penalties against the reference (a subset of rows, requests' rows permuted)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.penalties import apply_penalties  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [50, 2500])
def test_apply_penalties_matches_reference(dtype: torch.dtype, vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(4, vocab, generator=g) * 4).to(dtype).to(DEVICE)
    counts = torch.randint(0, 3, (3, vocab), generator=g).float().to(DEVICE)
    counts[counts < 2] = 0  # most tokens never generated
    in_prompt = (torch.rand(3, vocab, generator=g) < 0.2).to(torch.uint8).to(DEVICE)
    rows, slots = torch.tensor([3, 0], device=DEVICE), torch.tensor([2, 0], device=DEVICE)
    rep, freq, pres = (torch.tensor(v, device=DEVICE) for v in ([1.3, 0.6], [0.5, -1.0], [0.25, 2.0]))
    got, want = logits.clone(), logits.clone()
    apply_penalties(logits, got, rows, slots, counts, in_prompt, rep, freq, pres)
    reference.apply_penalties(logits, want, rows, slots, counts, in_prompt, rep, freq, pres)
    assert_close(got, want)
    assert torch.equal(got[1:3], logits[1:3]) and not torch.equal(got[0], logits[0])
    apply_penalties(logits, logits, rows, slots, counts, in_prompt, rep, freq, pres)  # in place
    assert torch.equal(logits, got)


def test_apply_penalties_checks_its_arguments() -> None:
    logits = torch.randn(2, 10, device=DEVICE)
    args = (torch.tensor([0], device=DEVICE), torch.tensor([0], device=DEVICE), torch.zeros(1, 10, device=DEVICE))
    floats = (torch.ones(1, device=DEVICE),) * 3
    with pytest.raises(AssertionError, match="in_prompt has dtype"):
        apply_penalties(logits, logits.clone(), *args, torch.zeros(1, 10, dtype=torch.bool, device=DEVICE), *floats)
    with pytest.raises(AssertionError, match="rep must be contiguous"):
        apply_penalties(logits, logits.clone(), *args, torch.zeros(1, 10, dtype=torch.uint8, device=DEVICE),
                        torch.ones(2, device=DEVICE), *floats[1:])
