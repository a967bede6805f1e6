"""Triton copy_blocks (the cuda_ipc transfer's per-layer gather/scatter) against the reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.copy_blocks import PoolCopy, copy_blocks  # noqa: E402


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


def _pools(layers: int, dtype: torch.dtype, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [L, 2, N, S, Hk, row] pools of random bits with different block counts."""
    src = torch.stack([_pool(7, row, dtype) for _ in range(layers)])
    dst = torch.stack([_pool(10, row, dtype) for _ in range(layers)])
    return src, dst


@pytest.mark.parametrize("dtype,row", [(torch.bfloat16, 16), (torch.float8_e4m3fn, 20)], ids=["bf16", "fp8+scales"])
@pytest.mark.parametrize("layer", [None, 0, 2])
def test_pool_copy_one_layer_or_all_matches_reference(dtype: torch.dtype, row: int, layer: int | None) -> None:
    """PoolCopy over whole pools: layer l touches only layer l; None copies every layer in one launch."""
    src, dst = _pools(3, dtype, row)
    src_ids = torch.tensor([6, 0, 3], dtype=torch.int32, device=DEVICE)
    dst_ids = torch.tensor([1, 9, 4], dtype=torch.int32, device=DEVICE)
    want = dst.clone()
    for l in range(3) if layer is None else [layer]:
        reference.copy_blocks(src[l], want[l], src_ids, dst_ids)
    PoolCopy(src, dst)(src_ids, dst_ids, layer)
    as_bytes = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731 - bitwise, NaNs included
    assert torch.equal(as_bytes(dst), as_bytes(want))


def test_pool_copy_unaligned_id_rows_and_bad_inputs() -> None:
    """Id vectors that are rows of one [2, n] tensor (the second row not 16-byte aligned)."""
    src, dst = _pools(2, torch.bfloat16, 16)
    ids = torch.tensor([[0, 5, 2], [8, 1, 3]], dtype=torch.int32, device=DEVICE)
    copy = PoolCopy(src, dst)
    copy(ids[0], ids[1])
    assert torch.equal(dst[:, :, [8, 1, 3]].view(torch.uint8), src[:, :, [0, 5, 2]].view(torch.uint8))
    copy(ids[0, :0], ids[1, :0], 1)  # nothing to copy
    with pytest.raises(AssertionError, match="layer 2 out of range"):
        copy(ids[0], ids[1], 2)
    with pytest.raises(AssertionError, match="equal 1-D"):
        copy(ids[0], ids[1, :2])
    with pytest.raises(AssertionError, match="int32/int64"):
        copy(ids[0].float(), ids[1])
    with pytest.raises(AssertionError, match="differ"):
        PoolCopy(src, dst[:1])
    with pytest.raises(AssertionError, match="dtype"):
        PoolCopy(src, dst.view(torch.float16))
    with pytest.raises(AssertionError, match=r"\[layers, planes, blocks"):
        PoolCopy(src.flatten(0, 3), dst.flatten(0, 3))
    with pytest.raises(AssertionError, match="layers of a pool must be packed"):
        PoolCopy(src.transpose(0, 1), dst.transpose(0, 1))
    with pytest.raises(AssertionError, match="power of 2"):
        PoolCopy(src, dst, words_per_program=24)


def test_pool_copy_small_tiles_split_a_block_into_chunks() -> None:
    """A tile smaller than a block (64 words here): each block is copied in 4 programs."""
    src, dst = _pools(2, torch.bfloat16, 16)
    want = dst.clone()
    ids_s = torch.tensor([6, 2], dtype=torch.int32, device=DEVICE)
    ids_d = torch.tensor([0, 9], dtype=torch.int32, device=DEVICE)
    for layer in range(2):
        reference.copy_blocks(src[layer], want[layer], ids_s, ids_d)
    PoolCopy(src, dst, words_per_program=16, num_warps=1)(ids_s, ids_d)
    assert torch.equal(dst.view(torch.uint8), want.view(torch.uint8))
