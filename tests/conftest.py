"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real default model folder (SmolLM2-135M-Instruct), built into the cache if absent."""
    from pdserve.model.prepare import ensure_default_model

    return ensure_default_model(progress=False)
