"""ModelSpec: the shape of a Llama-family model, read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelSpec:
    """Everything the model, the loader and the KV cache need to know about a checkpoint."""

    arch: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    o_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    sliding_window: int | None = None
    name: str = ""

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelSpec":
        """Read config.json (and generation_config.json for extra EOS ids) from an HF folder."""
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{cfg_file} not found: not a Hugging Face model folder")
        cfg = json.loads(cfg_file.read_text())
        gen_file = path / "generation_config.json"
        gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
        return cls.from_config_dict(cfg, generation_config=gen, name=path.name)

    @classmethod
    def from_config_dict(
        cls, d: dict[str, Any], generation_config: dict[str, Any] | None = None, name: str = ""
    ) -> "ModelSpec":
        """Build a spec from a config dict; raise ValueError for an unsupported model_type."""
        arch = d.get("model_type")
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(
                f"unsupported model_type {arch!r}: pdserve serves {', '.join(SUPPORTED_ARCHS)}"
            )
        if d.get("mlp_bias"):
            raise ValueError(f"model_type {arch!r} with mlp_bias=True is not supported")
        heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        rope_theta, rope_scaling = _rope(d)
        eos = _token_ids(d.get("eos_token_id")) + _token_ids((generation_config or {}).get("eos_token_id"))
        return cls(
            arch=arch,
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            vocab_size=int(d["vocab_size"]),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases (and no o_proj bias) whatever its config says.
            attention_bias=arch == "qwen2" or bool(d.get("attention_bias", False)),
            o_bias=arch != "qwen2" and bool(d.get("attention_bias", False)),
            qk_norm=arch == "qwen3",
            eos_token_ids=tuple(dict.fromkeys(eos)),
            bos_token_id=d.get("bos_token_id"),
            sliding_window=_sliding_window(d),
            name=name or str(d.get("_name_or_path", "")),
        )


def _rope(d: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from either `rope_theta`/`rope_scaling` (transformers 4) or
    `rope_parameters` (transformers 5, which folds theta into the same dict)."""
    params = d.get("rope_parameters") or d.get("rope_scaling")
    theta = d.get("rope_theta")
    if params and theta is None:
        theta = params.get("rope_theta")
    scaling = None
    if params:
        kind = params.get("rope_type", params.get("type"))
        if kind not in (None, "default"):
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
            scaling["rope_type"] = kind
    return float(theta if theta is not None else 10000.0), scaling


def _sliding_window(d: dict[str, Any]) -> int | None:
    # Qwen2/3 keep a window size in its config even when use_sliding_window is off.
    if d.get("model_type") in ("qwen2", "qwen3") and not d.get("use_sliding_window", False):
        return None
    w = d.get("sliding_window")
    return int(w) if w else None


def _token_ids(v: int | list[int] | None) -> tuple[int, ...]:
    if v is None:
        return ()
    return (int(v),) if isinstance(v, int) else tuple(int(x) for x in v)
