"""Load Llama-family weights from a Hugging Face safetensors folder into our weight names.

HF keeps q/k/v and gate/up as separate tensors; we fuse them at load time (see
`pdserve.model.llama.weight_shapes` for the names and shapes produced). A mixture of experts'
per-expert tensors are stacked into one [E, ...] tensor each (or read as such where the
checkpoint already holds them stacked, as transformers 5 names them in memory).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
import torch
from safetensors import safe_open

from pdserve.model.llama import weight_shapes
from pdserve.model.spec import ModelSpec

# Our name (inside layers.N.) -> the HF tensors concatenated along dim 0 to build it.
_LAYER_MAP: dict[str, tuple[str, ...]] = {
    "in_norm": ("input_layernorm.weight",),
    "post_norm": ("post_attention_layernorm.weight",),
    "qkv": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "qkv_bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "o": ("self_attn.o_proj.weight",),
    "o_bias": ("self_attn.o_proj.bias",),
    "gate_up": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down": ("mlp.down_proj.weight",),
    "q_norm": ("self_attn.q_norm.weight",),
    "k_norm": ("self_attn.k_norm.weight",),
    "shared_gate_up": ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"),
    "shared_down": ("mlp.shared_expert.down_proj.weight",),
    "shared_gate": ("mlp.shared_expert_gate.weight",),
}
# A routed MLP's module and its experts' (gate, up, down) names, by architecture.
_MOE_NAMES = {"mixtral": ("block_sparse_moe.", ("w1", "w3", "w2"))}
_QWEN_MOE_NAMES = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
_TOP_MAP = {"embed": ("model.embed_tokens.weight",), "norm": ("model.norm.weight",),
            "lm_head": ("lm_head.weight",)}


def load_weights(
    spec: ModelSpec,
    model_dir: str | Path | None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    load_format: str = "auto",
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Weights by our name. load_format "auto" reads safetensors, "dummy" makes random ones."""
    if load_format == "dummy":
        return dummy_weights(spec, device=device, dtype=dtype, seed=seed)
    if load_format != "auto":
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    if model_dir is None:
        raise ValueError("model_dir is required unless load_format='dummy'")
    files = _safetensors_files(Path(model_dir))
    with ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(str(f), framework="pt", device="cpu")) for f in files}
        where = {name: f for f, h in handles.items() for name in h.keys()}
        out: dict[str, torch.Tensor] = {}
        for name, shape in weight_shapes(spec).items():
            if name == "lm_head" and spec.tie_word_embeddings:
                continue
            groups, stack = _hf_groups(spec, name, where)
            missing = [n for g in groups for n in g if n not in where]
            if missing:
                raise ValueError(f"{model_dir}: tensor {missing[0]!r} is missing (needed for {name})")
            # a group's tensors are concatenated (q/k/v, gate/up); several groups (experts) stacked
            fused = [torch.cat([handles[where[n]].get_tensor(n) for n in g], dim=0) for g in groups]
            t = torch.stack(fused) if stack else fused[0]
            if tuple(t.shape) != shape:
                raise ValueError(f"{model_dir}: {name} has shape {tuple(t.shape)}, expected {shape}")
            out[name] = t.to(device=device, dtype=dtype)
    if spec.tie_word_embeddings:
        out["lm_head"] = out["embed"]  # share storage, as HF does
    return out


def dummy_weights(
    spec: ModelSpec, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Random weights of the right shapes without reading files: matrices and biases
    ~ N(0, 0.02), norm weights 1 (so activations keep a sane scale), seeded."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in weight_shapes(spec).items():
        if spec.tie_word_embeddings and name == "lm_head":
            continue
        t = torch.empty(shape, device=device, dtype=dtype)
        out[name] = t.fill_(1.0) if name.endswith("norm") else t.normal_(0.0, 0.02, generator=gen)
    if spec.tie_word_embeddings:
        out["lm_head"] = out["embed"]
    return out


@torch.no_grad()
def copy_into_hf(spec: ModelSpec, weights: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    """The inverse of load_weights: our tensors split back into a transformers model's
    `state_dict()` tensors (to run transformers on the same random weights in a benchmark)."""
    for name, t in weights.items():
        groups, stacked = _hf_groups(spec, name, state)
        for names, piece in zip(groups, t.unbind(0) if stacked else (t,)):
            parts = piece.split([state[n].shape[0] for n in names]) if len(names) > 1 else (piece,)
            for n, part in zip(names, parts):
                state[n].copy_(part)


def _hf_groups(spec: ModelSpec, name: str, present: dict[str, object]) -> tuple[list[tuple[str, ...]], bool]:
    """The HF tensors that make our tensor `name`: groups whose tensors are concatenated along
    dim 0, and whether the groups (a routed MLP's experts, one each) are then stacked."""
    if not name.startswith("layers."):
        return [_TOP_MAP[name]], False
    _, layer, rest = name.split(".", 2)
    p = f"model.layers.{layer}."
    if rest not in ("router", "experts_gate_up", "experts_down"):
        return [tuple(p + n for n in _LAYER_MAP[rest])], False
    module, (gate, up, down) = _MOE_NAMES.get(spec.arch, _QWEN_MOE_NAMES)
    # transformers 5 holds every routed MLP as "mlp." with stacked experts (Mixtral's too)
    if module != "mlp." and p + "mlp.gate.weight" in present:
        module = "mlp."
    p += module
    if rest == "router":
        return [(p + "gate.weight",)], False
    stacked = p + ("experts.gate_up_proj" if rest == "experts_gate_up" else "experts.down_proj")
    if stacked in present:
        return [(stacked,)], False
    parts = (gate, up) if rest == "experts_gate_up" else (down,)
    return [tuple(f"{p}experts.{e}.{n}.weight" for n in parts) for e in range(spec.num_experts)], True


def _safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / s for s in shards]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{model_dir}: shards listed in the index are missing: {absent}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(
        f"{model_dir}: neither model.safetensors nor model.safetensors.index.json found"
    )
