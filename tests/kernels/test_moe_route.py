"""Triton moe_route (softmax, top-k, renormalize) against reference.moe_route."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.moe_route import moe_route  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("t, e, k, renorm", [(1, 8, 2, True), (7, 60, 4, False), (5, 128, 8, True), (3, 5, 5, False)])
def test_moe_route_matches_reference(dtype: torch.dtype, t: int, e: int, k: int, renorm: bool) -> None:
    # distinct values a row, exact in bf16 too (k/8 for integers k < 128): no ties to order
    logits = torch.stack([(torch.randperm(e) - e // 2) / 8 for _ in range(t)]).to(dtype).to(DEVICE)
    weights, ids = moe_route(logits, k, renorm)
    want_w, want_ids = reference.moe_route(logits, k, renorm)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids.cpu(), want_ids.cpu())
    torch.testing.assert_close(weights.cpu(), want_w.cpu(), rtol=1e-5, atol=1e-6)
    if renorm:
        torch.testing.assert_close(weights.sum(-1).cpu(), torch.ones(t))


def test_ties_take_the_lowest_expert_and_bad_k_is_named() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]], device=DEVICE)
    weights, ids = moe_route(logits, 3, False)
    assert ids.tolist() == [[1, 2, 0]]
    assert weights[0, 0] == weights[0, 1] > weights[0, 2]
    assert moe_route(logits[:0], 2, True)[1].shape == (0, 2)
    with pytest.raises(AssertionError, match=r"top_k 5 must be in \[1, 4\]"):
        moe_route(logits, 5, True)
