"""ModelSpec: the shape of a Llama-family model, read from a Hugging Face config.json.

Mixture-of-experts variants (Mixtral, Qwen2-MoE, Qwen3-MoE) are the same decoder with some
MLPs replaced by a router over `num_experts` gated MLPs of `moe_intermediate_size`, of which
each token takes `num_experts_per_tok` (plus, in Qwen2-MoE, a sigmoid-gated shared expert).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe")


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
    # mixture of experts (0 experts: a dense model); the layers in moe_layers route
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalize the chosen experts' probabilities to sum to 1
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's always-on expert (0: none)
    moe_layers: tuple[int, ...] = ()

    def is_moe_layer(self, layer: int) -> bool:
        """True if `layer`'s MLP is a routed mixture of experts."""
        return layer in self.moe_layers

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
        layers = int(d["num_hidden_layers"])
        moe = _moe(arch, d, layers)
        eos = _token_ids(d.get("eos_token_id")) + _token_ids((generation_config or {}).get("eos_token_id"))
        return cls(
            arch=arch,
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=layers,
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
            attention_bias=arch in ("qwen2", "qwen2_moe") or bool(d.get("attention_bias", False)),
            o_bias=arch not in ("qwen2", "qwen2_moe") and bool(d.get("attention_bias", False)),
            qk_norm=arch in ("qwen3", "qwen3_moe"),
            eos_token_ids=tuple(dict.fromkeys(eos)),
            bos_token_id=d.get("bos_token_id"),
            sliding_window=_sliding_window(d),
            name=name or str(d.get("_name_or_path", "")),
            **moe,
        )


def _moe(arch: str, d: dict[str, Any], layers: int) -> dict[str, Any]:
    """The mixture-of-experts fields of a config (none for a dense architecture)."""
    if arch == "mixtral":  # every layer routes; the top-k probabilities always renormalized
        experts = _positive(d, "num_local_experts")
        return dict(num_experts=experts, moe_intermediate_size=int(d["intermediate_size"]),
                    num_experts_per_tok=_top_k(d, experts), norm_topk_prob=True,
                    moe_layers=tuple(range(layers)))
    if arch not in ("qwen2_moe", "qwen3_moe"):
        return {}
    # Qwen's own configs say num_experts, transformers 5 saves num_local_experts
    experts = int(d.get("num_experts") or d.get("num_local_experts") or 0)
    step = int(d.get("decoder_sparse_step") or 1)
    dense = {int(x) for x in d.get("mlp_only_layers") or ()}
    routed = tuple(l for l in range(layers) if experts > 0 and (l + 1) % step == 0 and l not in dense)
    if not routed:
        return {}
    return dict(num_experts=experts, num_experts_per_tok=_top_k(d, experts),
                moe_intermediate_size=_positive(d, "moe_intermediate_size"),
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                shared_expert_intermediate_size=int(d.get("shared_expert_intermediate_size") or 0)
                if arch == "qwen2_moe" else 0,
                moe_layers=routed)


def _top_k(d: dict[str, Any], experts: int) -> int:
    top_k = _positive(d, "num_experts_per_tok")
    if top_k > experts:
        raise ValueError(f"config.json: num_experts_per_tok ({top_k}) exceeds num_experts ({experts})")
    return top_k


def _positive(d: dict[str, Any], key: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


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
    if d.get("model_type") in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not d.get("use_sliding_window", False):
        return None
    w = d.get("sliding_window")
    return int(w) if w else None


def _token_ids(v: int | list[int] | None) -> tuple[int, ...]:
    if v is None:
        return ()
    return (int(v),) if isinstance(v, int) else tuple(int(x) for x in v)
