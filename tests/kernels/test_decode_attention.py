"""Triton paged decode attention (GQA, split-K) against the reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close, grid, make_block_tables, make_pool  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.decode_attention import decode_with_partitions, paged_decode_attention  # noqa: E402

SEQ_LENS = [1, 15, 16, 17, 100]
BLOCK = 16


def _case(dtype: torch.dtype, group: int, head_dim: int, kv_heads: int = 2):
    """Queries, layer-1 cache views of a 2-layer pool, block tables, seq lens."""
    pool = make_pool(2, 24, BLOCK, kv_heads, head_dim, dtype)
    tables = make_block_tables(SEQ_LENS, BLOCK, 24, width=8)
    lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=DEVICE)
    wide = torch.randn(len(SEQ_LENS), kv_heads * group + 1, head_dim, dtype=dtype, device=DEVICE)
    q = wide[:, 1:]  # strided view, as a slice of a fused qkv would be
    return q, pool[1, 0], pool[1, 1], tables, lens


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("group", "head_dim"), [(1, 64), (4, 128), (3, 64)])
def test_decode_matches_reference(dtype: torch.dtype, group: int, head_dim: int) -> None:
    q, kc, vc, tables, lens = _case(dtype, group, head_dim)
    scale = head_dim**-0.5
    out = paged_decode_attention(q, kc, vc, tables, lens, scale)
    assert_close(out, reference.paged_decode_attention(q, kc, vc, tables, lens, scale))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("partition", [16, 32, 256])
def test_decode_split_k_partitions(dtype: torch.dtype, partition: int) -> None:
    """16 and 32 cut the 100-token sequence into 7 and 4 partitions; 256 is a single one."""
    q, kc, vc, tables, lens = _case(dtype, 4, 64)
    out = decode_with_partitions(q, kc, vc, tables, lens, 0.125, partition)
    assert_close(out, reference.paged_decode_attention(q, kc, vc, tables, lens, 0.125))


@pytest.mark.parametrize("heads_first", [True, False])
@pytest.mark.parametrize("partition", [16, 256])
def test_decode_grid_orders_agree(heads_first: bool, partition: int) -> None:
    """Both program orders (a sequence's KV heads side by side, or sequences first) give the
    reference's result, split-K included (its partial sums are indexed by sequence and head)."""
    q, kc, vc, tables, lens = _case(torch.float32, 4, 64, kv_heads=3)
    out = decode_with_partitions(q, kc, vc, tables, lens, 0.125, partition, heads_first=heads_first)
    assert_close(out, reference.paged_decode_attention(q, kc, vc, tables, lens, 0.125))


@pytest.mark.parametrize("partition", [16, 256])
def test_decode_head_major_blocks(partition: int) -> None:
    """A cache whose blocks store each KV head's rows together ([N, Hk, S, D] seen as an
    [N, S, Hk, D] view) gives the same result as the slot-major pool holding the same values."""
    q, kc, vc, tables, lens = _case(torch.float32, 4, 64, kv_heads=3)
    khm, vhm = (c.transpose(1, 2).contiguous().transpose(1, 2) for c in (kc, vc))
    assert khm.stride(1) == 64 and khm.stride(2) == BLOCK * 64  # head-major inside a block
    out = decode_with_partitions(q, khm, vhm, tables, lens, 0.125, partition)
    assert_close(out, reference.paged_decode_attention(q, kc, vc, tables, lens, 0.125))
    assert torch.equal(out, decode_with_partitions(q, kc, vc, tables, lens, 0.125, partition))


def test_decode_rejects_interleaved_cache() -> None:
    q, kc, vc, tables, lens = _case(torch.float32, 1, 64)
    odd = kc.as_strided(kc.shape, (kc.stride(0), 64, 2 * 64, 1))  # rows of two heads overlap
    with pytest.raises(AssertionError, match="k_cache must be packed"):
        paged_decode_attention(q, odd, odd, tables, lens, 0.125)


def test_decode_rejects_int64_block_tables() -> None:
    q, kc, vc, tables, lens = _case(torch.float32, 1, 64)
    with pytest.raises(AssertionError, match="block_tables has dtype"):
        paged_decode_attention(q, kc, vc, tables.long(), lens, 0.125)
    with pytest.raises(AssertionError, match="multiple of KV heads"):
        paged_decode_attention(q[:, :1], kc, vc, tables, lens, 0.125)


def test_default_partition_splits_only_when_the_grid_is_small() -> None:
    from pdserve.kernels.decode_attention import default_partition_size, partition_for

    assert partition_for(1, 1, 8192, 132) == 256  # one long sequence: max split
    assert default_partition_size(1, 1, 8192, DEVICE) < 8192  # split on this device too
    assert default_partition_size(1024, 8, 4096, DEVICE) == 4096  # big batch: no split
    assert default_partition_size(4, 2, 64, DEVICE) == 256  # short context: one partition


@pytest.mark.parametrize(("batch", "best"), [(8, 512), (16, 1024), (32, 2048), (64, 4096), (256, 4096)])
def test_partition_on_132_sms_is_the_measured_best(batch: int, best: int) -> None:
    """The partition each batch of 4k-context sequences (8 KV heads) ran fastest with on an
    H100 (bench/results/attn-parts-h100-2026-12-05-s15b.json; below batch 8 that sweep timed
    the host's launch, not the kernels)."""
    from pdserve.kernels.decode_attention import partition_for

    assert partition_for(batch, 8, 4096, 132) == best


@pytest.mark.parametrize(("tiles", "head_dim", "partition", "off32"), grid(
    ["masked", "tail"], [pytest.param(64, 16, id="64-16"), pytest.param(80, 64, id="80-64")],
    [pytest.param(True, id="off32"), pytest.param(False, id="off64")]))
def test_decode_wide_table_spreads_each_sequence(tiles: str, head_dim: int, partition: int, off32) -> None:
    """A table far wider than the sequences: each one spreads over the partitions in whole
    tiles (a 100-token one over 7 of 32 at partition 16), the rest stay empty; full tiles are
    read with or without masks; offsets in 32-bit arithmetic or 64-bit (the default here)."""
    pool = make_pool(1, 40, BLOCK, 2, head_dim, torch.float32)
    tables = make_block_tables(SEQ_LENS, BLOCK, 40, width=32)
    lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(SEQ_LENS), 8, head_dim, device=DEVICE)
    out = decode_with_partitions(q, pool[0, 0], pool[0, 1], tables, lens, 0.1, partition,
                                 tiles=tiles, off32=off32)
    assert_close(out, reference.paged_decode_attention(q, pool[0, 0], pool[0, 1], tables, lens, 0.1))


def test_decode_refuses_soft_tiles_over_a_float_cache() -> None:
    q, kc, vc, tables, lens = _case(torch.float32, 1, 64)
    with pytest.raises(AssertionError, match="needs a quantized cache"):
        decode_with_partitions(q, kc, vc, tables, lens, 0.1, 16, tiles="soft")
    with pytest.raises(AssertionError, match="must be one of"):
        decode_with_partitions(q, kc, vc, tables, lens, 0.1, 16, tiles="none")


def test_offsets_fit_int32_counts_the_farthest_element() -> None:
    """The farthest element of a view, not its size, decides: a small view with a huge stride
    does not fit, and 2**31 - 2 is the last offset that does."""
    from pdserve.kernels.decode_attention import offsets_fit_int32

    def view(shape: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int8, device="meta").as_strided(shape, stride)

    assert offsets_fit_int32(view((2, 2), (2**31 - 3, 1)))
    assert not offsets_fit_int32(view((2, 2), (2**31 - 2, 1)))
    assert not offsets_fit_int32(view((2, 2), (2, 1)), view((3, 2), (2**30, 1)))
    assert offsets_fit_int32(view((2, 2), (2, 1)), view((0,), (2**40,)))
    assert offsets_fit_int32(view((2, 2), (2**32 - 6, 2)), unit=2)  # byte pairs: 2**31 - 2 pairs
