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
    """`gpu` tests need CUDA: elsewhere they are skipped (and reported as skipped, not passed)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
