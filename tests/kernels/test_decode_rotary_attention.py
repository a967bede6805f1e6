"""Rotary + KV write + paged decode attention in one kernel, against the two kernels it
replaces (rotary_write_kv, then decode attention) and against the reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close, grid, make_block_tables  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.decode_attention import decode_with_partitions  # noqa: E402
from pdserve.kernels.decode_rotary_attention import decode_rotary_attention  # noqa: E402
from pdserve.kernels.rotary_write_kv import rotary_write_kv  # noqa: E402
from pdserve.runtime.kv_quant import SCALE_BYTES, layer_views  # noqa: E402

BLOCK, NBLOCKS = 16, 24
SEQ_LENS = [1, 15, 16, 17, 100, 1]  # the last one is a CUDA-graph padding row: slot -1


def _case(hq: int, hk: int, d: int, dtype: torch.dtype, qdtype: torch.dtype | None, partial: float = 1.0):
    """Unrotated q, k, v of one new token per sequence (views of a fused qkv), positions,
    cos/sin, slots of each sequence's last position, block tables, lens, and two equal
    random 2-layer pools (layer 1 is used)."""
    b = len(SEQ_LENS)
    qkv = torch.randn(b, (hq + 2 * hk) * d, dtype=dtype, device=DEVICE)
    q, k, v = (x.view(b, -1, d) for x in qkv.split([hq * d, hk * d, hk * d], dim=-1))
    tables = make_block_tables(SEQ_LENS, BLOCK, NBLOCKS, width=8)
    lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=DEVICE)
    pos = (lens - 1).long()
    slots = tables[torch.arange(b, device=DEVICE), pos // BLOCK].long() * BLOCK + pos % BLOCK
    slots[-1] = -1
    cos_sin = reference.rope_cos_sin(d, 4096, 10000.0, None, partial).to(DEVICE)
    if qdtype is None:
        base = torch.randn(2, 2, NBLOCKS, BLOCK, hk, d, device=DEVICE).to(dtype)
    else:  # random codes, then random scales written through the scale views
        base = torch.randint(-100, 100, (2, 2, NBLOCKS, BLOCK, hk, d + SCALE_BYTES), device=DEVICE).to(qdtype)
        for layer in range(2):
            kv = layer_views(base, layer, d)
            kv.k_scale.uniform_(0.01, 0.06)
            kv.v_scale.uniform_(0.01, 0.06)
    pools = [base.clone(), base.clone()]
    return (q, k, v), pos.int(), cos_sin, slots.int(), tables, lens, pools


def _views(pool: torch.Tensor, d: int) -> tuple[torch.Tensor, ...]:
    kv = layer_views(pool, 1, d)
    return (kv.k, kv.v) + ((kv.k_scale, kv.v_scale) if kv.k_scale is not None else ())


@pytest.mark.parametrize(("dtype", "hq", "hk", "d", "partial", "qdtype", "partition"), grid(
    DTYPES,
    [pytest.param(2, 2, 64, 1.0, id="gqa1"), pytest.param(8, 2, 64, 1.0, id="gqa4"),
     pytest.param(8, 1, 48, 0.5, id="gqa8-d48-partial")],
    [pytest.param(None, id="plain"), pytest.param(torch.float8_e4m3fn, id="fp8"), pytest.param(torch.int8, id="int8")],
    [pytest.param(16, id="split"), pytest.param(256, id="whole")]))
def test_fused_equals_the_two_kernels(dtype, hq: int, hk: int, d: int, partial: float, qdtype, partition: int) -> None:
    """Output and every pool byte equal rotary_write_kv + decode attention (same partitions:
    the 100-token sequence spreads over 7 at 16, so the writer is one program of several);
    the padding row (slot -1) writes nothing."""
    (q, k, v), pos, cos_sin, slots, tables, lens, pools = _case(hq, hk, d, dtype, qdtype, partial)
    scale = d**-0.5
    kc, vc, *sc = _views(pools[0], d)
    want_q = rotary_write_kv(q, k, v, pos, cos_sin, kc, vc, slots, *sc)
    want = decode_with_partitions(want_q, kc, vc, tables, lens, scale, partition, *sc)
    kc, vc, *sc = _views(pools[1], d)
    before = pools[1].clone()
    got = decode_with_partitions(q, kc, vc, tables, lens, scale, partition, *sc,
                                 rope=_rope(k, v, pos, cos_sin, slots))
    assert not torch.equal(pools[1].view(torch.uint8), before.view(torch.uint8))  # it wrote
    assert torch.equal(pools[1].view(torch.uint8), pools[0].view(torch.uint8))
    assert torch.equal(got, want)


def _rope(k, v, pos, cos_sin, slots):
    from pdserve.kernels.decode_attention import RopeWrite

    return RopeWrite(k, v, pos, cos_sin, slots)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hk", "d"), [(4, 4, 64), (8, 2, 128), (8, 1, 64)], ids=["gqa1", "gqa4", "gqa8"])
def test_fused_matches_reference(dtype, hq: int, hk: int, d: int) -> None:
    """decode_rotary_attention (default partitions) against the plain-torch twin; the padding
    row is left out (the reference has no padding)."""
    (q, k, v), pos, cos_sin, slots, tables, lens, pools = _case(hq, hk, d, dtype, None)
    got = decode_rotary_attention(q, k, v, pos, cos_sin, *_views(pools[0], d)[:2], slots, tables, lens, d**-0.5)
    live = slice(0, len(SEQ_LENS) - 1)
    want = reference.decode_rotary_attention(
        q[live], k[live], v[live], pos[live], cos_sin, *_views(pools[1], d)[:2], slots[live], tables[live],
        lens[live], d**-0.5)
    if dtype == torch.bfloat16:  # outputs of size 1-2 differ by up to two bf16 ulps (0.0156 over
        # 150 seeds), past assert_close's 0.01 + 1.6 % where the output itself is small
        torch.testing.assert_close(got[live].float(), want.float(), rtol=1.6e-2, atol=2e-2)
    else:
        assert_close(got[live], want)
    assert_close(pools[0], pools[1])


def test_fused_attends_to_the_rotated_new_key() -> None:
    """A sequence whose new key is 3 q and whose earlier keys are 0 attends (almost) only to the
    new token: the output is its v, and the cache holds the rotated key (not k) at position 5."""
    q, v = torch.randn(1, 2, 64, device=DEVICE), torch.randn(1, 2, 64, device=DEVICE)
    k = 3 * q  # score of the new token: 3 |q|^2 / 8 ~ 24 above the earlier ones'
    cos_sin = reference.rope_cos_sin(64, 16, 10000.0).to(DEVICE)
    cache = torch.zeros(2, 4, BLOCK, 2, 64, device=DEVICE)
    table = torch.tensor([[2]], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor([5], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([6], dtype=torch.int32, device=DEVICE)
    out = decode_rotary_attention(q, k, v, pos, cos_sin, cache[0], cache[1],
                                  torch.tensor([2 * BLOCK + 5], dtype=torch.int32, device=DEVICE), table, lens, 0.125)
    _, k_rot = reference.rotary(q, k, pos, cos_sin)
    assert_close(cache[0, 2, 5], k_rot[0])
    assert not torch.allclose(cache[0, 2, 5], k[0], atol=1e-2)
    assert_close(cache[1, 2, 5], v[0])
    torch.testing.assert_close(out[0], v[0], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("change", "message"), [
    (lambda a: {**a, "slot_mapping": a["slot_mapping"][:1]}, "slot_mapping has 1 entries"),
    (lambda a: {**a, "positions": a["positions"].float()}, "positions has dtype"),
    (lambda a: {**a, "k": a["k"][:, :1]}, r"k \(6, 1, 64\) and v"),
    (lambda a: {**a, "seq_lens": a["seq_lens"][:1]}, "seq_lens 1"),
])
def test_fused_rejects_bad_input(change, message: str) -> None:
    (q, k, v), pos, cos_sin, slots, tables, lens, pools = _case(4, 2, 64, torch.float32, None)
    kc, vc = _views(pools[0], 64)[:2]
    args = dict(q=q, k=k, v=v, positions=pos, cos_sin=cos_sin, k_cache=kc, v_cache=vc, slot_mapping=slots,
                block_tables=tables, seq_lens=lens, scale=0.125)
    with pytest.raises(AssertionError, match=message):
        decode_rotary_attention(**change(args))


@pytest.mark.parametrize("partition", [16, 256], ids=["split", "whole"])
def test_fused_over_head_major_blocks(partition: int) -> None:
    """Over a pool whose blocks store each KV head's rows together ([N, Hk, S, D] seen as
    [N, S, Hk, D]), the kernel writes the new rows where a slot-major pool's view puts them and
    gives the same output as over the slot-major pool."""
    (q, k, v), pos, cos_sin, slots, tables, lens, pools = _case(8, 2, 64, torch.float32, None)
    head_major = pools[1].transpose(3, 4).contiguous().transpose(3, 4)  # same values, head-major
    assert head_major.stride(3) == 64 and head_major.stride(4) == BLOCK * 64
    want = decode_with_partitions(q, *_views(pools[0], 64)[:2], tables, lens, 0.125, partition,
                                  rope=_rope(k, v, pos, cos_sin, slots))
    got = decode_with_partitions(q, *_views(head_major, 64)[:2], tables, lens, 0.125, partition,
                                 rope=_rope(k, v, pos, cos_sin, slots))
    assert torch.equal(head_major, pools[0])  # element by element: the same writes
    assert torch.equal(got, want)
