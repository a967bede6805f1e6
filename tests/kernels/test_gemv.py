"""Triton gemv (batch-1 linear) against the reference, and the linear op's dispatch."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.gemv import gemv, gemv_tiles, linear  # noqa: E402


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
