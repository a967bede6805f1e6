"""Triton silu_and_mul against the reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.silu_and_mul import silu_and_mul  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [64, 1500])
def test_silu_and_mul_matches_reference(dtype: torch.dtype, inter: int) -> None:
    x = torch.randn(5, 2 * inter, dtype=dtype, device=DEVICE) * 3
    assert_close(silu_and_mul(x), reference.silu_and_mul(x))


def test_silu_and_mul_rejects_odd_width() -> None:
    with pytest.raises(AssertionError, match="must be even"):
        silu_and_mul(torch.randn(2, 7, device=DEVICE))
