"""Kernel test setup: interpreter mode on CPU-only machines and poisoned allocations.

TRITON_INTERPRET must be set before Triton is imported (kernels decide at decoration time),
so it is set here, at conftest import, and only when no CUDA device exists.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The suite runs with --import-mode=importlib: make kernel_helpers.py importable by the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _poisoned(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wrap torch.empty/empty_like so fresh float buffers hold NaN, never lucky zeros."""

    def make(*args: object, **kwargs: object) -> torch.Tensor:
        t = factory(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype in (torch.int32, torch.int64):
            t.fill_(-123456789)
        return t

    return make


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every output a kernel wrapper allocates starts as garbage (NaN), so unwritten
    elements fail the comparison; also reseeds so each test draws fresh random inputs."""
    monkeypatch.setattr(torch, "empty", _poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _poisoned(torch.empty_like))
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"torch seed {seed}")  # shown on failure, to replay the inputs
    torch.manual_seed(seed)
    yield
