from __future__ import annotations

import pytest

from pdserve.launch import Stack
from pdtest.stack import assert_no_leaks


@pytest.fixture(scope="module")
def stack(default_model_dir):
    """gateway + prefill + decode as three real processes, KV over tcp."""
    with Stack(model=str(default_model_dir), worker_args=["--max-model-len", "1024"],
               gateway_args=["--max-model-len", "1024"], decode_args=["--lease-ms", "2000"]) as st:
        yield st


@pytest.fixture
def client(stack):
    from pdserve.client import Client

    with Client(stack.gateway) as c:
        yield c
    assert_no_leaks(stack)


@pytest.fixture(scope="session")
def offline_runner(default_model_dir):
    """The single-process engine over the same weights (the oracle for the services)."""
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.runner import ModelRunner

    spec = ModelSpec.from_dir(default_model_dir)
    return ModelRunner(spec, default_model_dir, num_blocks=256, block_size=16)
