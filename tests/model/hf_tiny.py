"""Test helpers: tiny random Hugging Face models saved as safetensors, and a greedy oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

TINY = dict(
    vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    # Wider init than HF's 0.02 so greedy logits have clear winners (no float-noise ties).
    initializer_range=0.15, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
)
LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64, "rope_theta": 500000.0,
}
ARCHS: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama"),
    "llama3_rope": dict(model_type="llama", rope_parameters=LLAMA3_ROPE, head_dim=32, num_attention_heads=4),
    "llama_tied_bias": dict(model_type="llama", tie_word_embeddings=True, attention_bias=True),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3", head_dim=32),
    # routed MLPs: 4 experts, 2 per token; Qwen2-MoE with its shared expert and a dense layer
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "qwen2_moe": dict(model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                      shared_expert_intermediate_size=80, mlp_only_layers=[1]),
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=32, num_experts=8, num_experts_per_tok=3,
                      moe_intermediate_size=40, norm_topk_prob=True),
}


def build_tiny(kind: str, out: Path, seed: int = 0) -> Path:
    """Save a seeded random HF model of `kind` to `out`; biases and norms are randomized too
    (HF inits them to 0/1, which would hide a loader that drops them)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {**TINY, **ARCHS[kind]}
    model_type = kw.pop("model_type")
    config = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(out, safe_serialization=True)
    return out


def hf_model(model_dir: Path) -> Any:
    """The transformers model of a folder, float32 with eager attention (the oracle)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)


def hf_greedy_model(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy continuation of one prompt, ignoring EOS."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0,
    )
    return out[0, len(prompt):].tolist()


@pytest.fixture
def tiny_model(tmp_path: Path) -> Callable[[str], Path]:
    """Factory: tiny_model(kind) -> folder with config.json + model.safetensors."""
    return lambda kind, seed=0: build_tiny(kind, tmp_path / kind, seed)
