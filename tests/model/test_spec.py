"""ModelSpec from HF config dicts of every supported family (transformers 4 and 5 spellings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdserve.model.spec import ModelSpec

BASE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=8,
            vocab_size=1000, rms_norm_eps=1e-5, max_position_embeddings=4096)


def test_llama_defaults() -> None:
    s = ModelSpec.from_config_dict({**BASE, "model_type": "llama", "eos_token_id": 2, "bos_token_id": 1})
    assert (s.arch, s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim) == ("llama", 3, 8, 8, 32)
    assert s.eos_token_ids == (2,) and s.bos_token_id == 1
    assert s.rope_theta == 10000.0 and s.rope_scaling is None
    assert not (s.attention_bias or s.o_bias or s.qk_norm or s.tie_word_embeddings)


def test_llama31_rope_scaling_both_spellings() -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    v4 = ModelSpec.from_config_dict({**BASE, "model_type": "llama", "rope_theta": 500000.0,
                                     "rope_scaling": scaling, "eos_token_id": [128001, 128009]})
    v5 = ModelSpec.from_config_dict({**BASE, "model_type": "llama",
                                     "rope_parameters": {**scaling, "rope_theta": 500000.0}})
    assert v4.rope_theta == v5.rope_theta == 500000.0
    assert v4.rope_scaling == v5.rope_scaling == scaling
    assert v4.eos_token_ids == (128001, 128009)


def test_default_rope_parameters_mean_no_scaling() -> None:
    s = ModelSpec.from_config_dict({**BASE, "model_type": "qwen3", "head_dim": 128,
                                    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert s.rope_scaling is None and s.rope_theta == 1e6
    assert s.head_dim == 128 and s.qk_norm


def test_qwen2_bias_and_window() -> None:
    s = ModelSpec.from_config_dict({**BASE, "model_type": "qwen2", "num_key_value_heads": 2,
                                    "sliding_window": 4096, "use_sliding_window": False})
    assert s.attention_bias and not s.o_bias and s.num_kv_heads == 2 and s.sliding_window is None


def test_mistral_window() -> None:
    s = ModelSpec.from_config_dict({**BASE, "model_type": "mistral", "sliding_window": 4096})
    assert s.sliding_window == 4096


def test_unsupported_model_type_is_named() -> None:
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        ModelSpec.from_config_dict({**BASE, "model_type": "gpt2"})


def test_from_dir_merges_generation_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "model_type": "llama", "eos_token_id": 2,
                                                      "tie_word_embeddings": True}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    s = ModelSpec.from_dir(tmp_path)
    assert s.eos_token_ids == (2, 7) and s.tie_word_embeddings and s.name == tmp_path.name


def test_from_dir_without_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelSpec.from_dir(tmp_path)


def test_qwen3_moe_as_published() -> None:
    """Qwen3-30B-A3B's config.json spelling (num_experts; transformers 5 saves num_local_experts)."""
    s = ModelSpec.from_config_dict({**BASE, "model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8,
                                    "moe_intermediate_size": 768, "norm_topk_prob": True, "head_dim": 128,
                                    "decoder_sparse_step": 1, "mlp_only_layers": []})
    assert (s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size) == (128, 8, 768)
    assert s.moe_layers == (0, 1, 2) and s.norm_topk_prob and s.qk_norm and not s.attention_bias
    assert s.shared_expert_intermediate_size == 0


def test_qwen2_moe_sparse_step_and_dense_layers() -> None:
    s = ModelSpec.from_config_dict({**BASE, "model_type": "qwen2_moe", "num_hidden_layers": 6, "num_experts": 60,
                                    "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                                    "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 2,
                                    "mlp_only_layers": [3]})
    assert s.moe_layers == (1, 5) and s.is_moe_layer(5) and not s.is_moe_layer(3)
    assert s.shared_expert_intermediate_size == 5632 and s.attention_bias and not s.o_bias


def test_mixtral_routes_every_layer() -> None:
    s = ModelSpec.from_config_dict({**BASE, "model_type": "mixtral", "num_local_experts": 8,
                                    "num_experts_per_tok": 2, "sliding_window": None})
    assert s.moe_layers == (0, 1, 2) and s.moe_intermediate_size == 512 and s.norm_topk_prob
    assert s.num_experts == 8 and s.sliding_window is None


@pytest.mark.parametrize("bad, match", [
    ({"num_experts_per_tok": 0}, "num_experts_per_tok must be a positive integer"),
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok \(9\) exceeds num_experts \(8\)"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size must be a positive integer"),
])
def test_bad_moe_config_is_named(bad: dict, match: str) -> None:
    d = {**BASE, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
    with pytest.raises(ValueError, match=match):
        ModelSpec.from_config_dict({**d, **bad})
    if "moe_intermediate_size" not in bad:  # Mixtral checks the same two numbers
        m = {**BASE, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": bad["num_experts_per_tok"]}
        with pytest.raises(ValueError, match=match):
            ModelSpec.from_config_dict(m)
