"""Triton rotary against the reference, incl. Llama-3.1 scaling and partial rotary."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.rotary import rotary  # noqa: E402

LLAMA31 = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("head_dim", "scaling", "partial"),
    [(64, None, 1.0), (128, LLAMA31, 1.0), (64, None, 0.5)],
    ids=["d64", "d128-llama3", "d64-partial"],
)
def test_rotary_matches_reference(
    dtype: torch.dtype, head_dim: int, scaling: dict | None, partial: float
) -> None:
    t, hq, hk = 6, 4, 2
    cos_sin = reference.rope_cos_sin(head_dim, 40000, 500000.0, scaling, partial).to(DEVICE)
    qkv = torch.randn(t, (hq + 2 * hk) * head_dim, dtype=dtype, device=DEVICE)
    q = qkv[:, : hq * head_dim].view(t, hq, head_dim)  # strided views of a fused qkv
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(t, hk, head_dim)
    positions = torch.tensor([0, 1, 17, 5000, 20000, 39999], device=DEVICE)
    q_out, k_out = rotary(q, k, positions, cos_sin)
    q_ref, k_ref = reference.rotary(q, k, positions, cos_sin)
    assert_close(q_out, q_ref)
    assert_close(k_out, k_ref)


def test_rotary_rejects_bad_table() -> None:
    q = torch.randn(2, 2, 64, device=DEVICE)
    with pytest.raises(AssertionError, match="cos_sin"):
        rotary(q, q, torch.zeros(2, dtype=torch.int64, device=DEVICE), torch.zeros(8, 64).double())
