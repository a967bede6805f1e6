"""Prefill and decode as two processes on one GPU (KV over tcp), against the in-process engine."""

from __future__ import annotations

import pytest
import torch
from model.hf_tiny import build_tiny

from pdserve.core.sampling import SamplingParams
from pdserve.launch import Stack
from pdserve.model.spec import ModelSpec
from pdserve.runtime.offline import generate
from pdserve.runtime.runner import ModelRunner
from pdtest.stack import assert_no_leaks
from pdtest.tiny import word_tokenizer

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_two_processes_on_one_gpu_match_offline(tmp_path):
    folder = build_tiny("llama3_rope", tmp_path / "m")
    spec = ModelSpec.from_dir(folder)
    word_tokenizer(folder, spec.vocab_size)
    args = ["--device", "cuda", "--dtype", "float32", "--num-blocks", "256", "--max-model-len", "256"]
    prompts = [[(7 * i + j) % (spec.vocab_size - 3) + 3 for j in range(n)] for i, n in enumerate((5, 33, 70))]
    runner = ModelRunner(spec, folder, device="cuda", dtype=torch.float32, num_blocks=64, block_size=16)
    expected = generate(runner, prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    from pdserve.client import Client

    with Stack(model=str(folder), worker_args=args, gateway_args=["--max-model-len", "256"]) as st, Client(st.gateway) as c:
        got = [c.generate(token_ids=p, max_tokens=12, temperature=0.0, ignore_eos=True)[1] for p in prompts]
        assert got == expected
        assert_no_leaks(st)
