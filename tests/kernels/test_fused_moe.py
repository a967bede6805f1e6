"""Triton routed experts (fused_moe) against reference.moe_experts, and the tile grouping."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.fused_moe import expert_tiles, expert_tiles_torch, moe_experts  # noqa: E402


def _case(t: int, h: int, inter: int, e: int, k: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    gate_up = (torch.randn(e, 2 * inter, h, generator=g) / h**0.5).to(dtype)
    down = (torch.randn(e, h, inter, generator=g) / inter**0.5).to(dtype)
    weights, ids = reference.moe_route(torch.randn(t, e, generator=g) * 2, k, renormalize=seed % 2 == 0)
    return [v.to(DEVICE) for v in (x, weights, ids, gate_up, down)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, h, inter, e, k, gemv", [
    (1, 64, 32, 4, 2, True),       # one token: the decode path
    (1, 64, 32, 4, 2, False),      # ... and its tiles: only its experts' tiles run
    (5, 72, 40, 8, 3, True),       # widths that are not tile multiples
    (5, 72, 40, 8, 3, False),
    (33, 64, 48, 4, 1, False),     # more than a tile of rows for some expert
    (40, 32, 16, 16, 4, False),    # many experts, some unused
], ids=["1-gemv", "1-tiles", "5-gemv", "5-tiles", "33-tiles", "40-tiles"])
def test_moe_experts_matches_reference(dtype: torch.dtype, t: int, h: int, inter: int, e: int, k: int,
                                       gemv: bool) -> None:
    x, weights, ids, gate_up, down = _case(t, h, inter, e, k, dtype, seed=t)
    actual = moe_experts(x, weights, ids, gate_up, down, gemv=gemv)
    if dtype == torch.float32:
        assert_close(actual, reference.moe_experts(x, weights, ids, gate_up, down))
        return
    # bf16: three roundings (gate_up out, activation, down out) in another order than the
    # reference chain's, and toward zero in the interpreter: compare with the float32 result
    truth = reference.moe_experts(x.float(), weights, ids, gate_up.float(), down.float())
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.float(), truth, rtol=3e-2, atol=2e-2 * truth.abs().max().item())


def test_every_token_on_one_expert() -> None:
    """All pairs routed to the last expert: its run spans several tiles, the rest are empty."""
    x, weights, ids, gate_up, down = _case(37, 32, 16, 4, 1, torch.float32)
    ids = torch.full_like(ids, 3)
    for gemv in (False, True):
        assert_close(moe_experts(x, weights, ids, gate_up, down, gemv=gemv),
                     reference.moe_experts(x, weights, ids, gate_up, down))


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "triton"])
def test_expert_tiles_group_pairs_by_expert(kernel: bool) -> None:
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], device=DEVICE)
    rows, tile_expert = expert_tiles(ids, num_experts=4, block_m=2, max_kernel_pairs=6 if kernel else 0)
    pairs = ids.numel()
    assert rows.numel() == 10 and tile_expert.numel() == 5  # round_up(6 + 4 * (2 - 1), 2)
    flat = ids.reshape(-1).tolist()
    for tile, e in enumerate(tile_expert.tolist()):
        tile_rows = [r for r in rows[tile * 2:(tile + 1) * 2].tolist() if r != pairs]
        if e < 4:
            assert all(flat[r] == e for r in tile_rows) and tile_rows, (tile, e, tile_rows)
        else:
            assert not tile_rows
    real = sorted(r for r in rows.tolist() if r != pairs)
    assert real == list(range(pairs))  # every pair exactly once
    # expert 0: pairs 1, 4; expert 1: pair 3 and a pad; expert 2: pairs 0, 2, 5 (two tiles)
    assert tile_expert.tolist() == [0, 1, 2, 2, 4] and rows.tolist() == [1, 4, 3, 6, 0, 2, 5, 6, 6, 6]


@pytest.mark.parametrize("t, k, e, block_m", [(1, 8, 128, 16), (33, 4, 60, 16), (40, 2, 8, 64), (70, 1, 4, 16)])
def test_expert_tiles_kernel_equals_the_torch_grouping(t: int, k: int, e: int, block_m: int) -> None:
    """The Triton program's grouping is the torch one's, row for row (pairs past a 64-pair
    chunk, experts not a power of two, empty experts, one expert taking many tiles)."""
    g = torch.Generator().manual_seed(t)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    if t == 70:
        ids[:50] = 2  # one expert with several tiles, two without any
    ids = ids.to(DEVICE)
    rows, tiles = expert_tiles(ids, e, block_m, max_kernel_pairs=ids.numel())
    want_rows, want_tiles = expert_tiles_torch(ids, e, block_m)
    assert torch.equal(rows.cpu(), want_rows.cpu()) and torch.equal(tiles.cpu(), want_tiles.cpu())


def test_zero_tokens_and_bad_shapes() -> None:
    x, weights, ids, gate_up, down = _case(3, 32, 16, 4, 2, torch.float32)
    assert moe_experts(x[:0], weights[:0], ids[:0], gate_up, down).shape == (0, 32)
    # the default path: gemv for few pairs, tiles for many (both give the reference's result)
    big = _case(40, 32, 16, 4, 2, torch.float32)
    for case in ((x, weights, ids, gate_up, down), big):
        assert_close(moe_experts(*case), reference.moe_experts(*case))
    with pytest.raises(AssertionError, match="do not fit x"):
        moe_experts(x, weights, ids, gate_up, down[:, :, :8])
    with pytest.raises(AssertionError, match="ids has dtype torch.int32"):  # the grouping indexes with int64
        moe_experts(x, weights, ids.int(), gate_up, down)
    with pytest.raises(AssertionError, match=r"must both be \[T=3, k\]"):
        moe_experts(x, weights[:, :1], ids, gate_up, down)


def test_engine_on_triton_ops_gives_the_reference_tokens(tmp_path) -> None:
    """A tiny Qwen2-MoE (routed layer with a shared expert, then a dense one) through the
    engine on the Triton ops (interpreted on CPU; fp32 on a GPU) greedily decodes the reference ops' tokens."""
    from model.hf_tiny import build_tiny

    from pdserve.core.sampling import SamplingParams
    from pdserve.kernels import triton_ops
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.offline import generate
    from pdserve.runtime.runner import ModelRunner

    folder = build_tiny("qwen2_moe", tmp_path / "m")
    spec = ModelSpec.from_dir(folder)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = [[5, 9, 33, 7, 100, 4, 8, 200, 17], [3, 4]]
    want = generate(ModelRunner(spec, folder, num_blocks=32, block_size=16), prompts, params)
    torch.backends.cuda.matmul.allow_tf32 = False
    triton_runner = ModelRunner(spec, folder, device=DEVICE, dtype=torch.float32, num_blocks=32, block_size=16,
                                ops=triton_ops, enforce_eager=True)
    got = generate(triton_runner, prompts, params)
    assert got == want and all(len(set(toks)) > 3 for toks in want)
