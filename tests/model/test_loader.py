"""Loader: sharded safetensors, tied embeddings, missing tensors, dummy weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model.hf_tiny import build_tiny
from safetensors.torch import load_file, save_file

from pdserve.model.llama import weight_shapes
from pdserve.model.loader import load_weights
from pdserve.model.spec import ModelSpec


def _shard(folder: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100KB")


def test_sharded_equals_single(tmp_path: Path) -> None:
    single = build_tiny("qwen2", tmp_path / "single")
    _shard(single, tmp_path / "sharded")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    spec = ModelSpec.from_dir(single)
    a = load_weights(spec, single)
    b = load_weights(spec, tmp_path / "sharded")
    assert a.keys() == b.keys() == weight_shapes(spec).keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    hf = load_file(str(single / "model.safetensors"))
    q, k_ = hf["model.layers.1.self_attn.q_proj.bias"], hf["model.layers.1.self_attn.k_proj.bias"]
    assert torch.equal(a["layers.1.qkv_bias"][: q.numel() + k_.numel()], torch.cat([q, k_]))


def test_tied_embeddings_share_storage(tmp_path: Path) -> None:
    folder = build_tiny("llama_tied_bias", tmp_path / "m")
    w = load_weights(ModelSpec.from_dir(folder), folder, dtype=torch.bfloat16)
    assert w["lm_head"] is w["embed"] and w["embed"].dtype == torch.bfloat16


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    folder = build_tiny("llama", tmp_path / "m")
    state = load_file(str(folder / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_weights(ModelSpec.from_dir(folder), folder)


def test_no_weights_file(tmp_path: Path) -> None:
    folder = build_tiny("llama", tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_weights(ModelSpec.from_dir(folder), folder)


def test_dummy_is_seeded_and_shaped(tmp_path: Path) -> None:
    spec = ModelSpec.from_dir(build_tiny("qwen3", tmp_path / "m"))
    a = load_weights(spec, None, load_format="dummy", seed=1)
    b = load_weights(spec, None, load_format="dummy", seed=1)
    c = load_weights(spec, None, load_format="dummy", seed=2)
    assert {k: tuple(v.shape) for k, v in a.items()} == weight_shapes(spec)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.0.qkv"], c["layers.0.qkv"])
    assert 0.015 < a["layers.0.gate_up"].std().item() < 0.025


@pytest.mark.parametrize("kind", ["qwen2", "qwen2_moe", "mixtral"])
def test_copy_into_hf_inverts_the_loader(kind: str, tmp_path: Path) -> None:
    """Our weights written back into a fresh transformers model give the saved model's logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pdserve.model.loader import copy_into_hf

    folder = build_tiny(kind, tmp_path / "m")
    spec = ModelSpec.from_dir(folder)
    fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32)
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = torch.tensor([[5, 9, 33, 7]])
    assert not torch.allclose(fresh(ids).logits, saved(ids).logits)
    copy_into_hf(spec, load_weights(spec, folder), fresh.state_dict())
    torch.testing.assert_close(fresh(ids).logits, saved(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_stacked_experts_checkpoint_loads_the_same(kind: str, tmp_path: Path) -> None:
    """A checkpoint holding transformers 5's in-memory names (each layer's experts stacked in
    mlp.experts.gate_up_proj / down_proj, Mixtral's under mlp. too) loads as the per-expert one."""
    import shutil

    from transformers import AutoModelForCausalLM

    folder = build_tiny(kind, tmp_path / "m")
    stacked = tmp_path / "stacked"
    stacked.mkdir()
    shutil.copy(folder / "config.json", stacked / "config.json")
    state = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file({k: v.contiguous() for k, v in state.items()}, str(stacked / "model.safetensors"))
    spec = ModelSpec.from_dir(folder)
    a, b = load_weights(spec, folder), load_weights(spec, stacked)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
