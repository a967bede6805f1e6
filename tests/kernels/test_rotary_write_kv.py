"""The fused rotary + KV write against the two kernels it replaces and against the reference."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close, grid  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.rotary import rotary  # noqa: E402
from pdserve.kernels.rotary_write_kv import rotary_write_kv  # noqa: E402
from pdserve.kernels.write_kv import write_kv  # noqa: E402
from pdserve.runtime.kv_quant import SCALE_BYTES, LayerKv, layer_views  # noqa: E402

BLOCK, NBLOCKS, LAYER = 16, 8, 1  # layer 1 of 2: a stray write before its planes lands in the pool


def _qkv(t: int, hq: int, hk: int, d: int, dtype: torch.dtype):
    """q, k, v as strided views of one fused qkv row tensor, as the model splits it."""
    qkv = torch.randn(t, (hq + 2 * hk) * d, dtype=dtype, device=DEVICE) * 2
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    return q.view(t, hq, d), k.view(t, hk, d), v.view(t, hk, d)


def _pools(hk: int, d: int, dtype: torch.dtype, qdtype: torch.dtype | None):
    """Four equal random 2-layer pools (fused, two kernels, reference, untouched copy) and
    their layer views; quantized pools hold random codes and random scale bytes."""
    if qdtype is None:
        base = torch.randn(2, 2, NBLOCKS, BLOCK, hk, d, device=DEVICE).to(dtype)
    else:
        base = torch.randint(-100, 100, (2, 2, NBLOCKS, BLOCK, hk, d + SCALE_BYTES), device=DEVICE).to(qdtype)
    pools = [base.clone() for _ in range(4)]
    return pools, [layer_views(p, LAYER, d) for p in pools]


def _unwritten_bytes(views: LayerKv, written: torch.Tensor) -> list[torch.Tensor]:
    """The bytes of every slot not in `written` [N, S] bool: values and scales of K and V."""
    return [x[~written].view(torch.uint8) for x in views if x is not None]


@pytest.mark.parametrize(("dtype", "hq", "hk", "d", "partial", "qdtype"), grid(
    DTYPES,
    [pytest.param(4, 4, 64, 1.0, id="gqa1"), pytest.param(8, 2, 64, 1.0, id="gqa4"),
     pytest.param(8, 1, 48, 0.5, id="gqa8-d48-partial")],
    [pytest.param(None, id="plain"), pytest.param(torch.float8_e4m3fn, id="fp8"), pytest.param(torch.int8, id="int8")]))
def test_rotary_write_kv_matches_both_paths(dtype, hq: int, hk: int, d: int, partial: float, qdtype) -> None:
    """q equals rotary()'s; the cache (and scales) equal rotary() then write_kv() for every
    written slot, a padded token (slot -1) writes nothing, and every other slot keeps its bytes."""
    t = 21  # not a block multiple
    cos_sin = reference.rope_cos_sin(d, 4096, 10000.0, None, partial).to(DEVICE)
    q, k, v = _qkv(t, hq, hk, d, dtype)
    positions = torch.randint(0, 4096, (t,), dtype=torch.int32, device=DEVICE)
    slots = torch.randperm(NBLOCKS * BLOCK, device=DEVICE)[:t]
    slots[7] = -1  # its former slot is now written by nobody
    pools, views = _pools(hk, d, dtype, qdtype)
    scales = [(vw.k_scale, vw.v_scale) if qdtype is not None else () for vw in views]
    q_fused = rotary_write_kv(q, k, v, positions, cos_sin, views[0].k, views[0].v, slots, *scales[0])
    q_two, k_two = rotary(q, k, positions, cos_sin)
    write_kv(k_two, v, views[1].k, views[1].v, slots, *scales[1])
    assert torch.equal(q_fused, q_two)  # the padded token's q too
    # bytes and scales, written and untouched slots alike (as bytes: scale bytes read as fp8 may be NaN)
    assert torch.equal(pools[0].view(torch.uint8), pools[1].view(torch.uint8))
    # untouched: the other layer, and every slot of this one but the live tokens'
    live = slots >= 0
    blk, off = slots[live] // BLOCK, slots[live] % BLOCK
    written = torch.zeros(NBLOCKS, BLOCK, dtype=torch.bool, device=DEVICE)
    written[blk, off] = True
    assert torch.equal(pools[0][1 - LAYER].view(torch.uint8), pools[3][1 - LAYER].view(torch.uint8))
    for got, before in zip(_unwritten_bytes(views[0], written), _unwritten_bytes(views[3], written)):
        assert torch.equal(got, before)
    # and the reference: q, and the written rows dequantized (pad token left out: the
    # reference has no padding)
    q_ref, k_ref = reference.rotary(q, k, positions, cos_sin)
    assert_close(q_fused, q_ref)
    reference.write_kv(k_ref[live], v[live], views[2].k, views[2].v, slots[live], *scales[2])
    for x, y, i in ((views[0].k, views[2].k, 0), (views[0].v, views[2].v, 1)):
        if qdtype is None:
            assert_close(x[blk, off], y[blk, off])
        else:
            torch.testing.assert_close(scales[0][i][blk, off], scales[2][i][blk, off], rtol=2e-2, atol=1e-6)
            got = reference.dequantize_cache(x, scales[0][i])[blk, off]
            want = reference.dequantize_cache(y, scales[2][i])[blk, off]
            tol = 0.08 if qdtype == torch.float8_e4m3fn else 0.02
            ok = ((got - want).abs() <= tol * want.abs().amax(-1, keepdim=True) + 1e-3).float().mean()
            # Triton's CPU interpreter rounds ~1 % of fp8 conversions wrongly (test_kv_quant.py)
            assert ok > (0.97 if qdtype == torch.float8_e4m3fn and DEVICE.type == "cpu" else 0.9999)


def test_rotary_write_kv_rotates_the_stored_key() -> None:
    """The cache holds the rotated key, not k itself (position 5: a real rotation)."""
    q, k, v = _qkv(1, 2, 2, 64, torch.float32)
    cos_sin = reference.rope_cos_sin(64, 16, 10000.0).to(DEVICE)
    cache = torch.zeros(2, 4, BLOCK, 2, 64, device=DEVICE)
    pos = torch.tensor([5], device=DEVICE)
    rotary_write_kv(q, k, v, pos, cos_sin, cache[0], cache[1], torch.tensor([3], dtype=torch.int32, device=DEVICE))
    _, k_rot = reference.rotary(q, k, pos, cos_sin)
    assert_close(cache[0, 0, 3], k_rot[0])
    assert not torch.allclose(cache[0, 0, 3], k[0], atol=1e-2)
    assert_close(cache[1, 0, 3], v[0])


def test_rotary_write_kv_no_tokens() -> None:
    q, k, v = _qkv(0, 4, 2, 64, torch.bfloat16)
    cos_sin = reference.rope_cos_sin(64, 16, 10000.0).to(DEVICE)
    cache = torch.zeros(2, 4, BLOCK, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    out = rotary_write_kv(q, k, v, empty, cos_sin, cache[0], cache[1], empty)
    assert out.shape == (0, 4, 64) and out.dtype == torch.bfloat16 and not cache.any()


def _args() -> dict:
    """Valid arguments: 3 tokens, 4 query heads, 2 KV heads, head dim 64, fp32."""
    q, k, v = _qkv(3, 4, 2, 64, torch.float32)
    cache = torch.zeros(2, 4, BLOCK, 2, 64, device=DEVICE)
    return {"q": q, "k": k, "v": v, "positions": torch.zeros(3, dtype=torch.int64, device=DEVICE),
            "cos_sin": reference.rope_cos_sin(64, 16, 10000.0).to(DEVICE), "k_cache": cache[0],
            "v_cache": cache[1], "slot_mapping": torch.arange(3, device=DEVICE)}


def _int8_cache(a: dict, scale_heads: int) -> dict:
    cache = torch.zeros(2, 4, BLOCK, 2, 64, dtype=torch.int8, device=DEVICE)
    scale = torch.ones(4, BLOCK, scale_heads, device=DEVICE)
    return {"k_cache": cache[0], "v_cache": cache[1], "k_scale": scale, "v_scale": scale}


BAD: list[tuple[str, Callable[[dict], dict], str]] = [
    ("q-2d", lambda a: {"q": a["q"].flatten(1)}, r"q must be 3-D"),
    ("k-dtype", lambda a: {"k": a["k"].bfloat16()}, r"k dtype torch.bfloat16 != q dtype"),
    ("q-stride", lambda a: {"q": torch.randn(3, 4, 128, device=DEVICE)[..., ::2]}, r"q must have unit stride"),
    ("v-stride", lambda a: {"v": torch.randn(3, 2, 128, device=DEVICE)[..., ::2]}, r"v must have unit stride"),
    ("positions-dtype", lambda a: {"positions": a["positions"].float()}, r"positions has dtype"),
    ("positions-count", lambda a: {"positions": a["positions"][:2]}, r"token counts differ"),
    ("cos_sin-dtype", lambda a: {"cos_sin": a["cos_sin"].double()}, r"cos_sin has dtype"),
    ("cos_sin-width", lambda a: {"cos_sin": reference.rope_cos_sin(128, 16, 10000.0).to(DEVICE)},
     r"cos_sin width 128 must be even and <= head dim 64"),
    ("k-head-dim", lambda a: {"k": a["k"][..., :32]}, r"q head dim 64 != k head dim 32"),
    ("v-shape", lambda a: {"v": a["v"][:, :1]}, r"k \(3, 2, 64\) and v \(3, 1, 64\) differ"),
    ("cache-heads", lambda a: dict(zip(("k_cache", "v_cache"), torch.zeros(2, 4, BLOCK, 1, 64, device=DEVICE))),
     r"k rows \(2, 64\) do not match cache \(Hk, D\) \(1, 64\)"),
    ("cache-packing", lambda a: {"k_cache": a["k_cache"].transpose(0, 1), "v_cache": a["v_cache"].transpose(0, 1)},
     r"k_cache must be packed"),
    ("cache-dtypes", lambda a: {"v_cache": a["v_cache"].bfloat16()}, r"k_cache and v_cache dtypes differ"),
    ("slots-count", lambda a: {"slot_mapping": a["slot_mapping"][:2]}, r"slot_mapping has 2 entries for 3 tokens"),
    ("slots-dtype", lambda a: {"slot_mapping": a["slot_mapping"].float()}, r"slot_mapping has dtype"),
    ("one-scale", lambda a: {"k_scale": torch.ones(4, BLOCK, 2, device=DEVICE)}, r"both k_scale and v_scale"),
    ("scales-unquantized", lambda a: {"k_scale": torch.ones(4, BLOCK, 2, device=DEVICE),
                                      "v_scale": torch.ones(4, BLOCK, 2, device=DEVICE)}, r"k_cache has dtype"),
    ("scale-shape", lambda a: _int8_cache(a, 1), r"k_scale shape \(4, 16, 1\) != cache"),
]


@pytest.mark.parametrize(("change", "message"), [pytest.param(c, m, id=i) for i, c, m in BAD])
def test_rotary_write_kv_rejects_bad_input(change: Callable[[dict], dict], message: str) -> None:
    a = _args()
    a.update(change(a))
    with pytest.raises(AssertionError, match=message):
        rotary_write_kv(**a)
    assert not a["k_cache"].any() and not a["v_cache"].any()  # checked before any launch
