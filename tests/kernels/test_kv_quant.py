"""Quantized KV (fp8 e4m3, int8): write_kv and both attention kernels against the reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")


from kernel_helpers import DEVICE, DTYPES, assert_close, grid, make_block_tables  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.decode_attention import decode_with_partitions, paged_decode_attention  # noqa: E402
from pdserve.kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from pdserve.kernels.write_kv import write_kv  # noqa: E402
from pdserve.runtime.kv_quant import SCALE_BYTES, layer_views  # noqa: E402

QDTYPES = [pytest.param(torch.float8_e4m3fn, id="fp8"), pytest.param(torch.int8, id="int8")]
BLOCK, NBLOCKS, HK = 16, 24, 2


def _quant_pool(qdtype: torch.dtype, head_dim: int):
    """A 2-layer quantized pool filled from random values; returns layer-1 views."""
    pool = torch.zeros(2, 2, NBLOCKS, BLOCK, HK, head_dim + SCALE_BYTES, dtype=qdtype, device=DEVICE)
    views = layer_views(pool, 1, head_dim)
    for cache, sc in ((views.k, views.k_scale), (views.v, views.v_scale)):
        xq, s = reference.quantize_rows(torch.randn(NBLOCKS, BLOCK, HK, head_dim, device=DEVICE), qdtype)
        cache.copy_(xq)
        sc.copy_(s)
    return pool, views


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_write_kv_quantizes_like_reference(qdtype: torch.dtype) -> None:
    d, t = 32, 20
    k = torch.randn(t, HK, d, device=DEVICE) * 3
    v = torch.randn(t, HK, d, device=DEVICE)
    slots = torch.randperm(NBLOCKS * BLOCK, device=DEVICE)[:t]
    pools = [torch.zeros(1, 2, NBLOCKS, BLOCK, HK, d + SCALE_BYTES, dtype=qdtype, device=DEVICE) for _ in range(2)]
    a, b = layer_views(pools[0], 0, d), layer_views(pools[1], 0, d)
    write_kv(k, v, a.k, a.v, slots, a.k_scale, a.v_scale)
    reference.write_kv(k, v, b.k, b.v, slots, b.k_scale, b.v_scale)
    torch.testing.assert_close(a.k_scale, b.k_scale)
    torch.testing.assert_close(a.v_scale, b.v_scale)
    # Triton's CPU interpreter converts to fp8 wrongly when rounding carries into the next
    # exponent (e.g. -127.9 -> -64, about 1% of values); GPUs round in hardware (cvt.rn).
    fp8_interp = qdtype == torch.float8_e4m3fn and DEVICE.type == "cpu"
    blk, off = slots // BLOCK, slots % BLOCK
    for x, y in ((a.k, b.k), (a.v, b.v)):
        same = (x[blk, off].float() == y[blk, off].float()).float().mean()
        assert same > (0.97 if fp8_interp else 0.999)
    # the dequantized cache approximates the input
    deq = reference.dequantize_cache(b.k, b.k_scale)[blk, off]
    tol = 0.07 if qdtype == torch.float8_e4m3fn else 0.01
    assert ((deq - k).abs() <= tol * k.abs().amax(-1, keepdim=True)).all()


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("partition", [16, 256])
def test_decode_quantized_matches_reference(qdtype, dtype, partition) -> None:
    lens_list, d, group = [1, 15, 17, 100], 64, 4
    _, kv = _quant_pool(qdtype, d)
    tables = make_block_tables(lens_list, BLOCK, NBLOCKS, width=8)
    lens = torch.tensor(lens_list, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(lens_list), HK * group, d, dtype=dtype, device=DEVICE)
    out = decode_with_partitions(q, kv.k, kv.v, tables, lens, 0.125, partition, kv.k_scale, kv.v_scale)
    ref = reference.paged_decode_attention(q, kv.k, kv.v, tables, lens, 0.125, kv.k_scale, kv.v_scale)
    assert_close(out, ref)
    assert_close(paged_decode_attention(q, kv.k, kv.v, tables, lens, 0.125, kv.k_scale, kv.v_scale), ref)


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_decode_quantized_head_dim_16(qdtype) -> None:
    """A head dim of 16 (the smallest the dots take)."""
    lens_list, d, group = [5, 40], 16, 4
    _, kv = _quant_pool(qdtype, d)
    tables = make_block_tables(lens_list, BLOCK, NBLOCKS, width=4)
    lens = torch.tensor(lens_list, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(lens_list), HK * group, d, dtype=torch.bfloat16, device=DEVICE)
    ref = reference.paged_decode_attention(q, kv.k, kv.v, tables, lens, 0.25, kv.k_scale, kv.v_scale)
    assert_close(paged_decode_attention(q, kv.k, kv.v, tables, lens, 0.25, kv.k_scale, kv.v_scale), ref)


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_quantized_matches_reference(qdtype, dtype) -> None:
    lens_list, qlens, d, group = [5, 40, 17], [5, 3, 17], 32, 2
    _, kv = _quant_pool(qdtype, d)
    tables = make_block_tables(lens_list, BLOCK, NBLOCKS, width=4)
    lens = torch.tensor(lens_list, dtype=torch.int32, device=DEVICE)
    qsl = torch.tensor([0, 5, 8, 25], dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(qlens), HK * group, d, dtype=dtype, device=DEVICE)
    out = paged_prefill_attention(q, kv.k, kv.v, tables, lens, qsl, 0.2, kv.k_scale, kv.v_scale)
    ref = reference.paged_prefill_attention(q, kv.k, kv.v, tables, lens, qsl, 0.2, kv.k_scale, kv.v_scale)
    assert_close(out, ref)


def _poison_unused(kv, tables: torch.Tensor, lens_list: list[int]) -> None:
    """Slots no sequence owns get NaN codes and inf/NaN scales: they must never reach a result."""
    used = torch.zeros(NBLOCKS, BLOCK, dtype=torch.bool, device=DEVICE)
    for b, n in enumerate(lens_list):
        t = torch.arange(n, device=DEVICE)
        used[tables[b, t // BLOCK].long(), t % BLOCK] = True
    for cache in (kv.k, kv.v):
        cache.view(torch.uint8)[~used] = 0x7F
    kv.k_scale[~used] = float("inf")
    kv.v_scale[~used] = float("nan")


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_prefill_quantized_cached_prefix_odd_head_dim(qdtype) -> None:
    """Chunks after cached prefixes (a tail tile that is not full, causal masks inside the
    chunk), a head dim that is no power of two, unused slots poisoned."""
    lens_list, qlens, d, group = [37, 70, 9], [4, 20, 9], 80, 2
    _, kv = _quant_pool(qdtype, d)
    tables = make_block_tables(lens_list, BLOCK, NBLOCKS, width=6)
    _poison_unused(kv, tables, lens_list)
    lens = torch.tensor(lens_list, dtype=torch.int32, device=DEVICE)
    qsl = torch.tensor([0, 4, 24, 33], dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(qlens), HK * group, d, dtype=torch.bfloat16, device=DEVICE)
    out = paged_prefill_attention(q, kv.k, kv.v, tables, lens, qsl, 0.2, kv.k_scale, kv.v_scale)
    assert_close(out, reference.paged_prefill_attention(q, kv.k, kv.v, tables, lens, qsl, 0.2, kv.k_scale,
                                                        kv.v_scale))


@pytest.mark.parametrize("qdtype,path", [
    (torch.float8_e4m3fn, dict(k_convert=False, pairs=False)), (torch.float8_e4m3fn, dict(k_convert=True, pairs=False)),
    (torch.float8_e4m3fn, dict(pairs=True)), (torch.int8, dict(pairs=False)), (torch.int8, dict(pairs=True))],
    ids=["fp8-bit-moves", "fp8-convert", "fp8-pairs", "int8-bytes", "int8-pairs"])
def test_quantized_attention_close_to_full_precision(qdtype: torch.dtype, path: dict) -> None:
    """fp8/int8 KV attention equals bf16 attention over the same dequantized values up to the
    order of operations, with fp8 K upcast by bit moves (k_convert=False), by Triton's convert
    (the interpreter takes the bit moves either way), or the cache read as byte pairs (the
    default over both)."""
    d, lens_list = 64, [50, 100]
    pool, kv = _quant_pool(qdtype, d)
    full_k = reference.dequantize_cache(kv.k, kv.k_scale) + 0.0
    full_v = reference.dequantize_cache(kv.v, kv.v_scale) + 0.0
    tables = make_block_tables(lens_list, BLOCK, NBLOCKS, width=8)
    lens = torch.tensor(lens_list, dtype=torch.int32, device=DEVICE)
    q = (torch.randn(2, HK * 2, d, device=DEVICE) * 2).to(torch.bfloat16)
    out = decode_with_partitions(q, kv.k, kv.v, tables, lens, 0.125, 256, kv.k_scale, kv.v_scale, **path)
    assert_close(out, reference.paged_decode_attention(q, full_k, full_v, tables, lens, 0.125))


def test_scales_must_come_in_pairs() -> None:
    _, kv = _quant_pool(torch.int8, 32)
    q = torch.randn(1, HK, 32, device=DEVICE)
    tables = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(AssertionError, match="both k_scale and v_scale"):
        paged_decode_attention(q, kv.k, kv.v, tables, lens, 0.1, kv.k_scale, None)
    with pytest.raises(AssertionError, match="dtypes differ"):
        paged_decode_attention(q, kv.k, kv.v, tables, lens, 0.1)


@pytest.mark.parametrize(("qdtype", "tiles", "partition", "off32"), grid(
    QDTYPES, ["masked", "tail", "soft", "pairs"], [16, 64],
    [pytest.param(None, id="off32"), pytest.param(False, id="off64")]))
def test_decode_quantized_wide_table_odd_head_dim(qdtype, tiles, partition, off32) -> None:
    """A table wider than any sequence (most partitions empty, the rest split evenly in whole
    tiles: full unmasked tiles and a masked tail) and a head dim that is no power of two; the
    cache read as bytes (tiles="masked", "tail", "soft") or as byte pairs ("pairs")."""
    lens_list, d, group = [3, 70, 129], 80, 2
    _, kv = _quant_pool(qdtype, d)
    tables = make_block_tables(lens_list, BLOCK, NBLOCKS, width=NBLOCKS)
    lens = torch.tensor(lens_list, dtype=torch.int32, device=DEVICE)
    _poison_unused(kv, tables, lens_list)
    q = torch.randn(len(lens_list), HK * group, d, dtype=torch.bfloat16, device=DEVICE)
    how = dict(pairs=True) if tiles == "pairs" else dict(tiles=tiles, pairs=False)
    out = decode_with_partitions(q, kv.k, kv.v, tables, lens, 0.1, partition, kv.k_scale, kv.v_scale, **how,
                                 off32=off32)
    assert_close(out, reference.paged_decode_attention(q, kv.k, kv.v, tables, lens, 0.1, kv.k_scale, kv.v_scale))


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_pairs_keep_large_values_finite(qdtype: torch.dtype) -> None:
    """Values up to 1e5 (past where int8 pairs with fp8's P V gain would overflow fp16 on a GPU,
    and within e4m3's): the pairs path stays close to the reference, relative to the scale."""
    lens_list, d, big = [40, 77], 64, 1e5
    pool = torch.zeros(1, 2, NBLOCKS, BLOCK, HK, d + SCALE_BYTES, dtype=qdtype, device=DEVICE)
    kv = layer_views(pool, 0, d)
    for cache, sc, mag in ((kv.k, kv.k_scale, 1.0), (kv.v, kv.v_scale, big)):
        x = torch.randn(NBLOCKS, BLOCK, HK, d, device=DEVICE)
        xq, scale = reference.quantize_rows(x * mag / x.abs().amax(-1, keepdim=True), qdtype)
        cache.copy_(xq)
        sc.copy_(scale)
    tables = make_block_tables(lens_list, BLOCK, NBLOCKS, width=8)
    lens = torch.tensor(lens_list, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(lens_list), HK * 4, d, dtype=torch.bfloat16, device=DEVICE)
    out = decode_with_partitions(q, kv.k, kv.v, tables, lens, 0.125, 16, kv.k_scale, kv.v_scale, pairs=True)
    ref = reference.paged_decode_attention(q, kv.k, kv.v, tables, lens, 0.125, kv.k_scale, kv.v_scale)
    assert torch.isfinite(out).all()
    assert_close(out / big, ref / big)


def test_pairs_refused_where_they_do_not_apply() -> None:
    """pairs=True over a head dim of 16, a bf16 cache or float32 queries: a clear error."""
    tables = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(1, dtype=torch.int32, device=DEVICE)
    for qdtype, d, dtype in ((torch.float8_e4m3fn, 16, torch.bfloat16), (torch.int8, 64, torch.float32),
                             (torch.float8_e4m3fn, 64, torch.float32)):
        _, kv = _quant_pool(qdtype, d)
        q = torch.randn(1, HK, d, dtype=dtype, device=DEVICE)
        with pytest.raises(AssertionError, match="pairs needs an fp8 e4m3 or int8 cache"):
            decode_with_partitions(q, kv.k, kv.v, tables, lens, 0.1, 16, kv.k_scale, kv.v_scale, pairs=True)
    k = torch.zeros(4, BLOCK, HK, 64, dtype=torch.bfloat16, device=DEVICE)
    q = torch.randn(1, HK, 64, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(AssertionError, match="pairs needs an fp8 e4m3 or int8 cache"):
        decode_with_partitions(q, k, k, tables, lens, 0.1, 16, pairs=True)
