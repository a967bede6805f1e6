"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# One compute thread per process: `make test` runs two test processes beside the services they
# start (three processes a stack), all on a 2-core CI box; each with a thread per core would
# oversubscribe it. The services inherit the setting; tests that give their own keep theirs.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The services and clients the tests start need no API key unless a test gives one (a key in the
# developer's shell would lock them out of their own gateways).
for _name in ("PDSERVE_API_KEY", "VLLM_API_KEY"):
    os.environ.pop(_name, None)


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


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
