"""Triton gemv (batch-1 linear, alone and fused with the RMSNorm before it) against the
reference, and the dispatch of the linear and norm_linear ops."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.gemv import gemv, gemv_tiles, linear, norm_gemv, norm_glu, norm_linear  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k", "block_n", "block_k"), [(40, 64, 8, 32), (37, 100, 8, 32), (5, 48, 16, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_matches_reference(dtype, n: int, k: int, block_n: int, block_k: int, bias: bool) -> None:
    """Row and reduction counts that are and are not tile multiples, with and without bias."""
    x = torch.randn(1, k, dtype=dtype, device=DEVICE)
    w = torch.randn(n, k, dtype=dtype, device=DEVICE) * 0.1
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    out = gemv(x, w, b, block_n=block_n, block_k=block_k)
    assert_close(out, reference.linear(x.float(), w.float(), None if b is None else b.float()).to(dtype))


SHAPES = [(40, 64, 8, 32), (37, 100, 8, 32), (5, 48, 16, 64)]


def _norm_inputs(rows: int, k: int, n: int, dtype: torch.dtype, residual: bool = True, x_scale: float = 1.0):
    """x [rows, k] (times x_scale), a residual like it (or None), a norm weight in [0.5, 1.5)
    and a small weight [n, k]: the inputs of the norm-fused ops."""
    x = torch.randn(rows, k, dtype=dtype, device=DEVICE) * x_scale
    r = torch.randn(rows, k, dtype=dtype, device=DEVICE) if residual else None
    g = torch.rand(k, dtype=dtype, device=DEVICE) + 0.5
    return x, r, g, torch.randn(n, k, dtype=dtype, device=DEVICE) * 0.1


def _unrounded_norm(summed: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """What a fused kernel dots with: its own residual sum (checked against the reference on
    its own; the interpreter rounds bf16 toward zero, torch to nearest) normed in fp32 (the
    separate norm rounds it to bf16). Comparing with the rounded reference row put bf16
    results past the tolerance about once in ten seeds."""
    return reference.rms_norm(summed.float(), g.float(), eps, None)[0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k", "block_n", "block_k"), SHAPES)
@pytest.mark.parametrize("residual", [False, True])
def test_norm_gemv_matches_norm_then_linear(dtype, n: int, k: int, block_n: int, block_k: int,
                                            residual: bool) -> None:
    """One kernel = rms_norm then linear (the normed row unrounded), and the residual sum."""
    x, r, g, w = _norm_inputs(1, k, n, dtype, residual, x_scale=3)
    b = torch.randn(n, dtype=dtype, device=DEVICE)
    out, summed = norm_gemv(x, g, 1e-5, r, w, b, block_n=block_n, block_k=block_k)
    normed, want_sum = _unrounded_norm(summed, g, 1e-5), reference.rms_norm(x, g, 1e-5, r)[1]
    assert_close(out, reference.linear(normed, w.float(), b.float()).to(dtype))
    assert_close(summed, want_sum)  # the interpreter rounds bf16 toward zero, CUDA to nearest
    if not residual:
        assert summed is x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("i", "k", "block_n", "block_k"), [(20, 64, 8, 32), (37, 100, 8, 32), (3, 48, 16, 64)])
@pytest.mark.parametrize("residual", [False, True])
def test_glu_gemv_matches_norm_linear_then_silu_and_mul(dtype, i: int, k: int, block_n: int, block_k: int,
                                                       residual: bool) -> None:
    """glu: each program's block_n / 2 gate rows and the matching up rows, silu(g) * u stored
    (intermediate sizes that are and are not multiples of the half tile, with a bias)."""
    x, r, g, w = _norm_inputs(1, k, 2 * i, dtype, residual, x_scale=3)
    b = torch.randn(2 * i, dtype=dtype, device=DEVICE)
    out, summed = norm_gemv(x, g, 1e-5, r, w, b, block_n=block_n, block_k=block_k, glu=True)
    normed, want_sum = _unrounded_norm(summed, g, 1e-5), reference.rms_norm(x, g, 1e-5, r)[1]
    want = reference.silu_and_mul(reference.linear(normed, w.float(), b.float()))
    assert out.shape == (1, i)
    assert_close(out, want.to(dtype))
    assert_close(summed, want_sum)


@pytest.mark.parametrize("rows", [1, 3])
def test_norm_glu_matches_its_reference_at_any_batch(rows: int) -> None:
    """norm_glu: one fused kernel for one bf16 row, norm + linear + silu_and_mul otherwise."""
    x, r, g, w = _norm_inputs(rows, 64, 48, torch.bfloat16)
    out, summed = norm_glu(x, g, 1e-6, r, w)
    want_sum = reference.rms_norm(x, g, 1e-6, r)[1]
    if rows == 1:  # fused: the normed row and gate/up stay fp32 until silu(g) * u is stored
        want = reference.silu_and_mul(reference.linear(_unrounded_norm(summed, g, 1e-6), w.float()))
        assert_close(out, want.bfloat16())
    else:  # rms_norm, F.linear, silu_and_mul, each rounding to bf16 (in the interpreter toward
        # zero, the reference ops to nearest): up to ~3 ulps apart, 2-3 % (600 seeds checked)
        want = reference.norm_glu(x, g, 1e-6, r, w)[0]
        torch.testing.assert_close(out.float().cpu(), want.float().cpu(), rtol=3e-2, atol=2e-2)
    assert out.shape == (rows, 24)
    assert_close(summed, want_sum)


def test_glu_gemv_rejects_an_odd_weight() -> None:
    x = torch.randn(1, 32, device=DEVICE)
    with pytest.raises(AssertionError, match="even row count"):
        norm_gemv(x, torch.ones(32, device=DEVICE), 1e-5, None, torch.randn(7, 32, device=DEVICE), glu=True)


def test_fused_gemv_rejects_bad_inputs() -> None:
    w = torch.randn(8, 32, device=DEVICE)
    x = torch.randn(1, 32, device=DEVICE)
    with pytest.raises(AssertionError, match="norm_weight"):
        norm_gemv(x, torch.ones(16, device=DEVICE), 1e-5, None, w)
    with pytest.raises(AssertionError, match="residual"):
        norm_gemv(x, torch.ones(32, device=DEVICE), 1e-5, torch.randn(1, 16, device=DEVICE), w)
    with pytest.raises(AssertionError, match="features"):
        norm_gemv(torch.randn(1, 16, device=DEVICE), torch.ones(16, device=DEVICE), 1e-5, None, w)


@pytest.mark.parametrize("rows", [1, 3])
def test_fused_ops_match_their_reference_at_any_batch(rows: int) -> None:
    """norm_linear: one fused kernel for one bf16 row, two ops otherwise."""
    x, r, g, w = _norm_inputs(rows, 64, 24, torch.bfloat16)
    out, summed = norm_linear(x, g, 1e-6, r, w)
    want, want_sum = reference.norm_linear(x.float(), g.float(), 1e-6, r.float(), w.float())
    assert_close(out, want.bfloat16())
    assert_close(summed, want_sum.bfloat16())


def test_gemv_rejects_bad_inputs() -> None:
    w = torch.randn(8, 32, device=DEVICE)
    with pytest.raises(AssertionError, match="one row"):
        gemv(torch.randn(2, 32, device=DEVICE), w)
    with pytest.raises(AssertionError, match="features"):
        gemv(torch.randn(1, 16, device=DEVICE), w)
    with pytest.raises(AssertionError, match="block_k"):
        gemv(torch.randn(1, 32, device=DEVICE), w, block_k=24)


def test_linear_takes_gemv_for_one_half_precision_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """One bf16 row goes through gemv (same numbers), several rows and fp32 through F.linear."""
    import pdserve.kernels.gemv as mod

    calls: list[tuple[int, ...]] = []
    real = mod.gemv
    monkeypatch.setattr(mod, "gemv", lambda *a, **kw: calls.append(tuple(a[1].shape)) or real(*a, **kw))
    w = torch.randn(24, 64, dtype=torch.bfloat16, device=DEVICE) * 0.1
    one = torch.randn(1, 64, dtype=torch.bfloat16, device=DEVICE)
    assert_close(linear(one, w), reference.linear(one.float(), w.float()).bfloat16())
    assert calls == [(24, 64)]
    linear(torch.randn(3, 64, dtype=torch.bfloat16, device=DEVICE), w)
    linear(torch.randn(1, 64, device=DEVICE), w.float())
    assert calls == [(24, 64)]


def test_gemv_tiles_follow_the_shape() -> None:
    assert gemv_tiles(4096, 14336) == (16, 1024, 8)  # long rows (down)
    assert gemv_tiles(128256, 4096) == (16, 256, 4)  # many rows (gate_up, lm_head)
    assert gemv_tiles(6144, 4096) == (8, 512, 4)


def test_prefetch_plan_covers_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next weight's first PREFETCH_BYTES, in 128-byte lines spread over the programs, each
    line once; none for a missing, empty or strided tensor, or in the interpreter (PTX only)."""
    import pdserve.kernels.gemv as mod

    w = torch.zeros(4096, 4096, dtype=torch.bfloat16)  # 32 MiB
    monkeypatch.setattr(mod, "interpreting", lambda: False)
    monkeypatch.setattr(mod, "PREFETCH_BYTES", 8 << 20)
    flat, lines, per = mod._prefetch_plan(w, w.device, 768)
    assert flat.dtype == torch.uint8 and flat.numel() == w.numel() * 2
    assert lines == mod.PREFETCH_BYTES // 128 and per == 86 and per * 768 >= lines > (per - 1) * 768
    small = torch.zeros(10, 10, dtype=torch.bfloat16)  # 200 bytes: 2 lines
    assert mod._prefetch_plan(small, small.device, 768)[1:] == (2, 1)
    monkeypatch.setattr(mod, "PREFETCH_BYTES", 64 << 20)
    assert mod._prefetch_plan(w, w.device, 768)[1:] == (262144, 342)  # capped at the tensor
    monkeypatch.setattr(mod, "PREFETCH_BYTES", 8 << 20)
    for bad in (None, w.t(), torch.zeros(0)):
        assert mod._prefetch_plan(bad, w.device, 768) == (None, 1, 0)
    monkeypatch.setattr(mod, "PREFETCH_BYTES", 0)
    assert mod._prefetch_plan(w, w.device, 768) == (None, 1, 0)
    monkeypatch.setattr(mod, "interpreting", lambda: True)
    monkeypatch.setattr(mod, "PREFETCH_BYTES", 8 << 20)
    assert mod._prefetch_plan(w, w.device, 768) == (None, 1, 0)
