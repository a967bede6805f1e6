"""Greedy tokens of our engine equal transformers' generate() token for token."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from model.hf_tiny import ARCHS, hf_greedy_model, hf_model, tiny_model  # noqa: F401 (fixture)

from pdserve.core.sampling import SamplingParams
from pdserve.model.spec import ModelSpec
from pdserve.runtime.offline import generate
from pdserve.runtime.runner import ModelRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def _prompts(vocab: int, lengths: tuple[int, ...], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_greedy_matches_transformers(kind: str, tiny_model) -> None:
    folder = tiny_model(kind)
    spec = ModelSpec.from_dir(folder)
    runner = ModelRunner(spec, folder, num_blocks=32, block_size=16)
    prompts = _prompts(spec.vocab_size, (1, 17, 40))
    ours = generate(runner, prompts, GREEDY)
    model = hf_model(folder)
    expected = [hf_greedy_model(model, p, GREEDY.max_tokens) for p in prompts]
    assert ours == expected
    # A model stuck on one token would match trivially; these random ones are not.
    assert all(len(set(toks)) > 3 for toks in ours)


def test_tiny_configs_exercise_each_feature(tiny_model) -> None:
    """The parametrized cases above really cover what they claim to."""
    specs = {k: ModelSpec.from_dir(tiny_model(k))
             for k in ("llama3_rope", "llama_tied_bias", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe")}
    assert specs["llama3_rope"].rope_scaling["rope_type"] == "llama3"
    assert specs["llama3_rope"].rope_theta == 500000.0
    assert specs["llama_tied_bias"].tie_word_embeddings and specs["llama_tied_bias"].o_bias
    assert specs["qwen2"].attention_bias and not specs["qwen2"].o_bias
    assert specs["qwen3"].qk_norm and specs["qwen3"].head_dim == 32
    assert specs["mixtral"].moe_layers == (0, 1) and specs["mixtral"].norm_topk_prob
    q2 = specs["qwen2_moe"]  # a routed layer with a shared expert, then a dense one
    assert q2.moe_layers == (0,) and q2.shared_expert_intermediate_size == 80 and q2.attention_bias
    assert not q2.norm_topk_prob
    q3 = specs["qwen3_moe"]
    assert q3.num_experts == 8 and q3.num_experts_per_tok == 3 and q3.norm_topk_prob and q3.qk_norm


def test_transformers_loads_with_pdserve_installed(tiny_model) -> None:
    """pdserve installs no top-level `kernels` package: transformers >= 5.25 depends on the
    PyPI `kernels` (hub kernels) and imports it; a package of ours by that name shadowed it and
    every service failed to import transformers (pdserve's kernels live in pdserve.kernels)."""
    from transformers import AutoModelForCausalLM

    import pdserve.kernels  # noqa: I001 - after transformers on purpose

    found = importlib.util.find_spec("kernels")
    ours = Path(pdserve.kernels.__file__).parent
    # absent, the PyPI package, or a namespace package (origin None: pytest puts tests/ on the
    # path, and tests/kernels has no __init__.py; the device machine has no PyPI `kernels`)
    assert found is None or found.origin is None or Path(found.origin).parent != ours
    model = AutoModelForCausalLM.from_pretrained(tiny_model("llama"), dtype=torch.float32)
    assert len(hf_greedy_model(model, [5, 6, 7], 4)) == 4


@pytest.mark.slow
def test_default_model_matches_transformers(default_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    texts = ["What is the capital of France?", "Write a haiku about the sea.", "Count from one to ten:"]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
        for t in texts
    ]
    # transformers 5 returns a BatchEncoding here, 4 a plain list.
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    spec = ModelSpec.from_dir(default_model_dir)
    runner = ModelRunner(spec, default_model_dir, num_blocks=64, block_size=16)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    ours = generate(runner, prompts, params)
    model = hf_model(default_model_dir)
    expected = [hf_greedy_model(model, p, 64) for p in prompts]
    assert ours == expected
