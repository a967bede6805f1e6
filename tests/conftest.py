"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real default model folder (SmolLM2-135M-Instruct), built into the cache if absent."""
    from pdserve.model.prepare import ensure_default_model

    return ensure_default_model(progress=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests need CUDA: elsewhere they are skipped (and reported as skipped, not passed).

    Modules with `slow` tests go first, each module's tests in their order: `make test` hands
    whole modules to its two workers in this order (`--dist loadscope --no-loadscope-reorder`),
    so the long ones start early and the short ones even out the workers' ends."""
    import torch

    slow = {item.module for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.module not in slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
