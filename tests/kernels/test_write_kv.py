"""Triton write_kv against the reference, into layer views of a pool."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, make_pool  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.write_kv import write_kv  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_write_kv_matches_reference(dtype: torch.dtype, head_dim: int) -> None:
    pool = make_pool(3, 6, 16, 2, head_dim, dtype)
    pool.fill_(float("nan"))
    expected = pool.clone()
    t = 21
    slots = torch.randperm(6 * 16)[:t].to(DEVICE)
    k = torch.randn(t, 2, head_dim, dtype=dtype, device=DEVICE)
    v = torch.randn(t, 2, head_dim, dtype=dtype, device=DEVICE)
    write_kv(k, v, pool[1, 0], pool[1, 1], slots)
    reference.write_kv(k, v, expected[1, 0], expected[1, 1], slots)
    # NaN == NaN here, so untouched slots (and layers 0, 2) must stay exactly as they were.
    torch.testing.assert_close(pool, expected, rtol=0, atol=0, equal_nan=True)


def test_write_kv_skips_negative_slots() -> None:
    pool = torch.zeros(1, 2, 2, 16, 1, 64, device=DEVICE)
    k = torch.ones(2, 1, 64, device=DEVICE)
    write_kv(k, k, pool[0, 0], pool[0, 1], torch.tensor([3, -1], device=DEVICE))
    assert pool[0, 0, 0, 3].eq(1).all() and pool.sum().item() == 2 * 64


def test_write_kv_rejects_mismatched_heads() -> None:
    pool = torch.zeros(1, 2, 2, 16, 2, 64, device=DEVICE)
    k = torch.ones(2, 1, 64, device=DEVICE)
    with pytest.raises(AssertionError, match="do not match cache"):
        write_kv(k, k, pool[0, 0], pool[0, 1], torch.tensor([0, 1], device=DEVICE))
