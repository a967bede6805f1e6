"""The default model folder: building it, finding it, and that it is the real model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pdserve.model import prepare
from pdserve.model.prepare import (
    DEFAULT_MODEL_NAME,
    MARKER_FILE,
    default_cache_dir,
    ensure_default_model,
    resolve_model,
)


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_default_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PDSERVE_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("PDSERVE_CACHE")
    assert default_cache_dir() == tmp_path / "xdg" / "pdserve"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "pdserve"


@pytest.mark.parametrize("kind", ["missing", "file", "no_config", "no_weights"])
def test_resolve_model_rejects_bad_paths(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "m"
    if kind == "file":
        target.write_text("x")
    elif kind == "no_config":
        target.mkdir()
        (target / "model.safetensors").write_bytes(b"")
    elif kind == "no_weights":
        target.mkdir()
        (target / "config.json").write_text("{}")
        (target / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="--model"):
        resolve_model(str(target))


@pytest.mark.parametrize("weights", ["model-00001-of-00002.safetensors", "model.safetensors.index.json"])
def test_resolve_model_accepts_hf_folder(tmp_path: Path, weights: str) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / weights).write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_install_replaces_unmarked_leftover_and_keeps_complete(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "junk").write_text("half-written")
    built = tmp_path / "built"
    built.mkdir()
    (built / MARKER_FILE).write_text("{}")
    prepare._install(built, target)
    assert sorted(p.name for p in target.iterdir()) == [MARKER_FILE]

    loser = tmp_path / "loser"
    loser.mkdir()
    (loser / "other").write_text("x")
    prepare._install(loser, target)  # a complete target wins; no error
    assert (target / MARKER_FILE).is_file() and not (target / "other").exists()


def test_default_aliases_resolve_to_default(default_model_dir: Path) -> None:
    for alias in (None, "default", DEFAULT_MODEL_NAME):
        assert resolve_model(alias) == default_model_dir


def test_ensure_default_model_is_idempotent(default_model_dir: Path) -> None:
    assert default_model_dir.name == DEFAULT_MODEL_NAME
    assert (default_model_dir / MARKER_FILE).is_file()
    before = _snapshot(default_model_dir)
    start = time.perf_counter()
    again = ensure_default_model(progress=False)
    assert time.perf_counter() - start < 1.0
    assert again == default_model_dir
    assert _snapshot(again) == before
    assert not [p for p in again.parent.iterdir() if p.name.startswith(f".{DEFAULT_MODEL_NAME}.tmp-")]


def test_folder_contents(default_model_dir: Path) -> None:
    from safetensors import safe_open

    config = json.loads((default_model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True
    assert config["dtype"] == "bfloat16"
    assert config["model_type"] == "llama"
    assert not any(str(v).find(".tmp-") >= 0 for v in config.values())
    gen = json.loads((default_model_dir / "generation_config.json").read_text())
    assert 2 in gen["eos_token_id"]
    with safe_open(str(default_model_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert "model.embed_tokens.weight" in keys
        assert "lm_head.weight" not in keys
        assert len([k for k in keys if k.startswith("model.layers.")]) == 30 * 9
        assert str(f.get_tensor("model.norm.weight").dtype) == "torch.bfloat16"


def test_loads_in_transformers_and_answers_paris(default_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir, local_files_only=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tok.chat_template, "chat template lost when writing the folder"
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=30, do_sample=False)
    answer = tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_resolve_model_config_only_folder_for_dummy_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="load-format dummy"):
        resolve_model(str(tmp_path))
    assert resolve_model(str(tmp_path), require_weights=False) == tmp_path.resolve()
    with pytest.raises(ValueError, match="no config.json"):
        (tmp_path / "config.json").unlink()
        resolve_model(str(tmp_path), require_weights=False)


def test_worker_builds_dummy_model_from_config_only_folder(tmp_path: Path) -> None:
    import argparse
    import json

    from pdserve.worker import add_worker_args, build

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 300, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    p = argparse.ArgumentParser()
    add_worker_args(p)
    base = ["--port", "1", "--model", str(tmp_path), "--device", "cpu", "--max-model-len", "256",
            "--num-blocks", "32", "--max-num-seqs", "4"]
    built = build(p.parse_args([*base, "--load-format", "dummy"]))
    assert built.spec.vocab_size == 300 and built.runner.num_blocks == 32
    with pytest.raises(ValueError, match="safetensors"):
        build(p.parse_args(base))
