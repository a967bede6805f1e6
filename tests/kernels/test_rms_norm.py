"""Triton rms_norm against the reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.rms_norm import rms_norm  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(dtype: torch.dtype, hidden: int, with_residual: bool) -> None:
    wide = torch.randn(7, hidden + 32, dtype=dtype, device=DEVICE)
    x = wide[:, :hidden]  # row-strided view
    weight = torch.randn(hidden, dtype=dtype, device=DEVICE)
    residual = torch.randn(7, hidden, dtype=dtype, device=DEVICE) if with_residual else None
    out, summed = rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_sum = reference.rms_norm(x, weight, 1e-6, residual)
    assert_close(out, ref_out)
    assert_close(summed, ref_sum)


def test_rms_norm_rejects_bad_inputs() -> None:
    x = torch.randn(3, 64, device=DEVICE)
    with pytest.raises(AssertionError, match="weight has 32"):
        rms_norm(x, torch.ones(32, device=DEVICE), 1e-6)
    with pytest.raises(AssertionError, match="unit stride"):
        rms_norm(x.t(), torch.ones(3, device=DEVICE), 1e-6)
    with pytest.raises(AssertionError, match="residual dtype"):
        rms_norm(x, torch.ones(64, device=DEVICE), 1e-6, x.double())
