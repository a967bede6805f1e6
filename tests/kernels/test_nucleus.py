"""The sort-free top-k / top-p threshold against its sorted reference twin."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.nucleus import nucleus_threshold  # noqa: E402

V = 2500  # one partial tile at the default 4096; three of 1024, the last one partial
KNOBS = {"defaults": {}, "nc4-tiles1024": {"candidates": 4, "block": 1024, "num_warps": 8},
         "nc8-tiles1024": {"candidates": 8, "block": 1024, "num_warps": 4}}
# (temperature, top_k, top_p) per row: off, top-p only, top-k only, both, extremes
ROWS = [(1.0, 0, 1.0), (1.0, 0, 0.9), (0.7, 0, 0.5), (1.3, 40, 1.0), (1.0, 40, 0.8), (0.5, 300, 0.95),
        (2.0, 1, 1.0), (1.0, 0, 1e-6), (1.0, V, 0.6), (1.0, -1, 0.95), (0.25, 7, 0.3), (4.0, 0, 0.97)]


def _params(rows=ROWS):
    t, k, p = zip(*rows)
    return (torch.tensor(t, dtype=torch.float32, device=DEVICE), torch.tensor(k, dtype=torch.int32, device=DEVICE),
            torch.tensor(p, dtype=torch.float32, device=DEVICE))


def _assert_valid(x: torch.Tensor, temp: float, k: int, p: float, low: torch.Tensor) -> None:
    """low is a valid threshold of row x up to fp32 rounding of the sums: the kept mass (of
    the top-k set's renormalised softmax) reaches top_p, without low's tokens it does not."""
    kth = x.sort(descending=True).values[k - 1] if 1 <= k < x.numel() else x.min()
    probs = (x / temp).masked_fill(x < kth, float("-inf")).softmax(-1)
    assert low >= kth and probs[x >= low].sum() >= min(p, 1.0) - 1e-5 and probs[x > low].sum() < p + 1e-5, low


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-ties"])
def test_threshold_equals_sorted_reference(dtype: torch.dtype, knobs: dict[str, int]) -> None:
    """Random logits (bf16: many tied values, some at the threshold), one row per setting; the
    tuning knobs (candidates per pass, tile, warps) change the search, never the result."""
    logits = (torch.randn(len(ROWS), V, device=DEVICE) * 3).to(dtype)
    temps, ks, ps = _params()
    got = nucleus_threshold(logits, temps, ks, ps, **knobs)
    want = reference.nucleus_threshold(logits, temps, ks, ps)
    for r in (got != want).nonzero().flatten().tolist():  # fp32 sums in another order (1 row in ~300)
        _assert_valid(logits[r].float(), *ROWS[r], got[r])
    assert (got != want).sum() <= 1, (got, want)
    assert got[0] == logits[0].float().min() and got[6] == logits[6].float().max()  # off; top-k 1
    assert got[7] == logits[7].float().max()  # top-p so small that only the most likely stays


def test_threshold_with_masked_tokens() -> None:
    """-inf logits (suppressed ids): they carry no mass; a row with three finite logits."""
    logits = torch.randn(4, V, device=DEVICE) * 2
    logits[:, ::3] = float("-inf")
    logits[3] = float("-inf")
    logits[3, [5, 900, 2400]] = torch.tensor([1.0, 3.0, 2.0], device=DEVICE)
    temps, ks, ps = _params([(1.0, 0, 0.9), (1.0, 20, 1.0), (0.8, 50, 0.7), (1.0, 0, 0.9)])
    got = nucleus_threshold(logits, temps, ks, ps)
    assert torch.equal(got, reference.nucleus_threshold(logits, temps, ks, ps))
    # row 3: softmax of (1, 3, 2) is (0.09, 0.67, 0.24): 0.9 needs the 3 and the 2
    assert got[3] == 2.0


def test_threshold_keeps_the_top_p_mass() -> None:
    """The kept set's probability reaches top_p, and without its smallest logit it would not."""
    torch.manual_seed(0)
    logits = torch.randn(6, V, device=DEVICE) * 2.5
    rows = [(1.0, 0, p) for p in (0.1, 0.3, 0.5, 0.7, 0.9, 0.99)]
    temps, ks, ps = _params(rows)
    low = nucleus_threshold(logits, temps, ks, ps)
    for r, row in enumerate(rows):
        _assert_valid(logits[r], *row, low[r])


@pytest.mark.parametrize(("change", "message"), [
    (lambda a: {**a, "logits": a["logits"][0]}, r"logits must be 2-D, got shape \(2500,\)"),
    (lambda a: {**a, "top_k": a["top_k"].float()}, "top_k has dtype"),
    (lambda a: {**a, "top_p": a["top_p"][:2]}, r"top_p must be a contiguous \[12\] tensor"),
    (lambda a: {**a, "temperature": a["temperature"].double()}, "temperature has dtype"),
])
def test_threshold_rejects_bad_input(change, message: str) -> None:
    temps, ks, ps = _params()
    args = {"logits": torch.randn(len(ROWS), V, device=DEVICE), "temperature": temps, "top_k": ks, "top_p": ps}
    with pytest.raises(AssertionError, match=message):
        nucleus_threshold(**change(args))


@pytest.mark.gpu
def test_threshold_at_llama3_vocab_on_gpu() -> None:
    """256 rows of bf16 logits at Llama-3's 128,256 vocab (a decode batch), settings cycling."""
    logits = (torch.randn(256, 128256, device="cuda") * 4).bfloat16()
    temps, ks, ps = _params((ROWS * 22)[:256])
    got = nucleus_threshold(logits, temps, ks, ps)
    want = reference.nucleus_threshold(logits, temps, ks, ps)
    rows = (ROWS * 22)[:256]
    for r in (got != want).nonzero().flatten().tolist():
        _assert_valid(logits[r].float(), *rows[r], got[r])
    assert (got != want).sum() <= 4, (got != want).sum()
