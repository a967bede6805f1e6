"""Triton copy_blocks (the cuda_ipc transfer's per-layer gather/scatter) against the reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE  # noqa: E402

from kernels import reference  # noqa: E402
from kernels.copy_blocks import copy_blocks  # noqa: E402


def _pool(blocks: int, row: int, dtype: torch.dtype) -> torch.Tensor:
    """One layer [2, N, S=4, Hk=2, row] of random bits (NaN patterns included for floats)."""
    raw = torch.randint(0, 255, (2, blocks, 4, 2, row * torch.finfo(dtype).bits // 8 if dtype.is_floating_point
                                 else row), dtype=torch.uint8, device=DEVICE)
    return raw.view(dtype)


@pytest.mark.parametrize("dtype,row", [(torch.bfloat16, 16), (torch.float32, 8), (torch.float8_e4m3fn, 20),
                                       (torch.int8, 68)], ids=["bf16", "fp32", "fp8+scales", "int8+scales"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_copy_blocks_matches_reference(dtype: torch.dtype, row: int, index_dtype: torch.dtype) -> None:
    src, dst = _pool(9, row, dtype), _pool(12, row, dtype)
    src_ids = torch.tensor([3, 0, 8, 5], dtype=index_dtype, device=DEVICE)
    dst_ids = torch.tensor([11, 2, 7, 0], dtype=index_dtype, device=DEVICE)
    want = dst.clone()
    reference.copy_blocks(src, want, src_ids, dst_ids)
    untouched = [b for b in range(12) if b not in dst_ids.tolist()]
    before = dst[:, untouched].clone()
    copy_blocks(src, dst, src_ids, dst_ids)
    as_bytes = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731 - bitwise, NaNs included
    assert torch.equal(as_bytes(dst), as_bytes(want))
    assert torch.equal(as_bytes(dst[:, untouched]), as_bytes(before))
    assert torch.equal(as_bytes(dst[:, dst_ids.long()]), as_bytes(src[:, src_ids.long()]))


def test_copy_blocks_layer_views_of_pools() -> None:
    """Layer views of [L, 2, N, ...] pools (strided planes) copy only that layer."""
    src = torch.randn(3, 2, 6, 4, 2, 16, device=DEVICE).to(torch.bfloat16)
    dst = torch.zeros(3, 2, 5, 4, 2, 16, device=DEVICE, dtype=torch.bfloat16)
    ids = torch.tensor([1, 4], dtype=torch.int32, device=DEVICE)
    copy_blocks(src[1], dst[1], ids, ids.flip(0))
    assert torch.equal(dst[1][:, 4], src[1][:, 1]) and torch.equal(dst[1][:, 1], src[1][:, 4])
    assert dst[0].abs().sum() == 0 and dst[2].abs().sum() == 0
    assert dst[1][:, [0, 2, 3]].abs().sum() == 0


def test_copy_blocks_empty_and_bad_inputs() -> None:
    src = torch.zeros(2, 4, 4, 2, 8, device=DEVICE)
    copy_blocks(src, src.clone(), torch.zeros(0, dtype=torch.int32, device=DEVICE),
                torch.zeros(0, dtype=torch.int32, device=DEVICE))
    ids = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
    with pytest.raises(AssertionError, match="dtype"):
        copy_blocks(src, src.to(torch.bfloat16), ids, ids)
    with pytest.raises(AssertionError, match="src_ids"):
        copy_blocks(src, src.clone(), ids[:1], ids)
    with pytest.raises(AssertionError, match="blocks"):
        copy_blocks(src, torch.zeros(2, 4, 4, 2, 4, device=DEVICE), ids, ids)
