"""The fused rotary + KV write against the two kernels it replaces and against the reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.rotary import rotary  # noqa: E402
from pdserve.kernels.rotary_write_kv import rotary_write_kv  # noqa: E402
from pdserve.kernels.write_kv import write_kv  # noqa: E402
from pdserve.runtime.kv_quant import SCALE_BYTES, layer_views  # noqa: E402

BLOCK, NBLOCKS = 16, 8


def _qkv(t: int, hq: int, hk: int, d: int, dtype: torch.dtype):
    """q, k, v as strided views of one fused qkv row tensor, as the model splits it."""
    qkv = torch.randn(t, (hq + 2 * hk) * d, dtype=dtype, device=DEVICE) * 2
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    return q.view(t, hq, d), k.view(t, hk, d), v.view(t, hk, d)


def _pools(hk: int, d: int, dtype: torch.dtype, qdtype: torch.dtype | None):
    """Three equal random pools (fused, two kernels, reference) and their layer-0 views."""
    if qdtype is None:
        base = torch.randn(1, 2, NBLOCKS, BLOCK, hk, d, device=DEVICE).to(dtype)
    else:
        base = torch.randint(-100, 100, (1, 2, NBLOCKS, BLOCK, hk, d + SCALE_BYTES), device=DEVICE).to(qdtype)
    pools = [base.clone() for _ in range(3)]
    return pools, [layer_views(p, 0, d) for p in pools]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hk", "d", "partial"), [(4, 4, 64, 1.0), (8, 2, 64, 1.0), (8, 1, 48, 0.5)],
                         ids=["gqa1", "gqa4", "gqa8-d48-partial"])
@pytest.mark.parametrize("qdtype", [None, torch.float8_e4m3fn, torch.int8], ids=["plain", "fp8", "int8"])
def test_rotary_write_kv_matches_both_paths(dtype, hq: int, hk: int, d: int, partial: float, qdtype) -> None:
    """q equals rotary()'s; the cache (and scales) equal rotary() then write_kv() for every
    written slot, a padded token (slot -1) writes nothing, and every other slot keeps its bytes."""
    t = 21  # not a block multiple
    cos_sin = reference.rope_cos_sin(d, 4096, 10000.0, None, partial).to(DEVICE)
    q, k, v = _qkv(t, hq, hk, d, dtype)
    positions = torch.randint(0, 4096, (t,), device=DEVICE)
    slots = torch.randperm(NBLOCKS * BLOCK, device=DEVICE)[:t]
    slots[7] = -1
    pools, views = _pools(hk, d, dtype, qdtype)
    scales = [(vw.k_scale, vw.v_scale) if qdtype is not None else () for vw in views]
    q_fused = rotary_write_kv(q, k, v, positions, cos_sin, views[0].k, views[0].v, slots, *scales[0])
    q_two, k_two = rotary(q, k, positions, cos_sin)
    write_kv(k_two, v, views[1].k, views[1].v, slots, *scales[1])
    assert torch.equal(q_fused, q_two)
    # bytes and scales, written and untouched slots alike (as bytes: scale bytes read as fp8 may be NaN)
    assert torch.equal(pools[0].view(torch.uint8), pools[1].view(torch.uint8))
    # and the reference: q, and the written rows dequantized (pad token left out: the
    # reference has no padding)
    live = slots >= 0
    q_ref, k_ref = reference.rotary(q, k, positions, cos_sin)
    assert_close(q_fused, q_ref)
    reference.write_kv(k_ref[live], v[live], views[2].k, views[2].v, slots[live], *scales[2])
    blk, off = slots[live] // BLOCK, slots[live] % BLOCK
    for x, y, sx, sy in ((views[0].k, views[2].k, 0, 2), (views[0].v, views[2].v, 1, 2)):
        if qdtype is None:
            assert_close(x[blk, off], y[blk, off])
        else:
            got = reference.dequantize_cache(x, scales[0][sx])[blk, off]
            want = reference.dequantize_cache(y, scales[sy][sx])[blk, off]
            tol = 0.08 if qdtype == torch.float8_e4m3fn else 0.02
            ok = ((got - want).abs() <= tol * want.abs().amax(-1, keepdim=True) + 1e-3).float().mean()
            # Triton's CPU interpreter rounds ~1 % of fp8 conversions wrongly (test_kv_quant.py)
            assert ok > (0.97 if qdtype == torch.float8_e4m3fn and DEVICE.type == "cpu" else 0.9999)


def test_rotary_write_kv_rotates_the_stored_key() -> None:
    """The cache holds the rotated key, not k itself (position 5: a real rotation)."""
    q, k, v = _qkv(1, 2, 2, 64, torch.float32)
    cos_sin = reference.rope_cos_sin(64, 16, 10000.0).to(DEVICE)
    cache = torch.zeros(2, 4, BLOCK, 2, 64, device=DEVICE)
    rotary_write_kv(q, k, v, torch.tensor([5], device=DEVICE), cos_sin, cache[0], cache[1],
                    torch.tensor([3], device=DEVICE))
    _, k_rot = reference.rotary(q, k, torch.tensor([5], device=DEVICE), cos_sin)
    assert_close(cache[0, 0, 3], k_rot[0])
    assert not torch.allclose(cache[0, 0, 3], k[0], atol=1e-2)
    assert_close(cache[1, 0, 3], v[0])


def test_rotary_write_kv_rejects_bad_inputs() -> None:
    q, k, v = _qkv(3, 4, 2, 64, torch.float32)
    cos_sin = reference.rope_cos_sin(64, 16, 10000.0).to(DEVICE)
    cache = torch.zeros(2, 4, BLOCK, 2, 64, device=DEVICE)
    pos = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    slots = torch.arange(3, device=DEVICE)
    with pytest.raises(AssertionError, match="token counts"):
        rotary_write_kv(q, k, v, pos[:2], cos_sin, cache[0], cache[1], slots)
    with pytest.raises(AssertionError, match="slot_mapping"):
        rotary_write_kv(q, k, v, pos, cos_sin, cache[0], cache[1], slots[:2])
    with pytest.raises(AssertionError, match="k_scale"):
        rotary_write_kv(q, k, v, pos, cos_sin, cache[0], cache[1], slots, torch.ones(4, BLOCK, 2, device=DEVICE))
    with pytest.raises(AssertionError, match="cache"):
        rotary_write_kv(q, k, v, pos, cos_sin, cache[0, :, :, :1], cache[1, :, :, :1], slots)
