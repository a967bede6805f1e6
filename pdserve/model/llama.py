"""The one Llama-family forward pass (Llama 2/3/3.1, Mistral, Qwen2, Qwen3, SmolLM2, and the
mixture-of-experts Mixtral, Qwen2-MoE and Qwen3-MoE).

Functional over a dict of weights in our own names (see `weight_shapes`): q/k/v and gate/up
are fused so each layer runs two matmuls fewer. Every op goes through `ops`, a namespace with
the functions of `pdserve.kernels.reference` (CPU) or `pdserve.kernels.triton_ops` (CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import torch
import torch.nn.functional as F

from pdserve.model.spec import ModelSpec
from pdserve.runtime.kv_quant import layer_views

LayerHook = Callable[[int], None]


@dataclass(frozen=True)
class AttnMetadata:
    """Batch layout for attention, built once per step by the runner.

    slot_mapping [T] int32/int64: flat cache slot (block * block_size + offset) of each new token.
    block_tables [B, max_blocks] int32, seq_lens [B] int32 (cached + new tokens),
    query_start_loc [B+1] int32. `is_decode` means every sequence has exactly one new token
    (the paged decode kernel is used). `logits_indices` selects the tokens whose final hidden
    states `forward` returns (None: all of them).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    is_decode: bool
    logits_indices: torch.Tensor | None = None


def weight_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight the model reads (the loader's and dummy init's contract)."""
    h, d, i = spec.hidden_size, spec.head_dim, spec.intermediate_size
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * d
    shapes: dict[str, tuple[int, ...]] = {
        "embed": (spec.vocab_size, h),
        "norm": (h,),
        "lm_head": (spec.vocab_size, h),
    }
    for layer in range(spec.num_layers):
        p = f"layers.{layer}."
        shapes |= {
            p + "in_norm": (h,),
            p + "post_norm": (h,),
            p + "qkv": (qkv, h),
            p + "o": (h, spec.num_heads * d),
        }
        if spec.is_moe_layer(layer):
            e, m = spec.num_experts, spec.moe_intermediate_size
            shapes |= {p + "router": (e, h), p + "experts_gate_up": (e, 2 * m, h), p + "experts_down": (e, h, m)}
            if spec.shared_expert_intermediate_size:
                s = spec.shared_expert_intermediate_size
                shapes |= {p + "shared_gate_up": (2 * s, h), p + "shared_down": (h, s), p + "shared_gate": (1, h)}
        else:
            shapes |= {p + "gate_up": (2 * i, h), p + "down": (h, i)}
        if spec.attention_bias:
            shapes[p + "qkv_bias"] = (qkv,)
        if spec.o_bias:
            shapes[p + "o_bias"] = (h,)
        if spec.qk_norm:
            shapes[p + "q_norm"] = (d,)
            shapes[p + "k_norm"] = (d,)
    return shapes


class LlamaModel:
    """Forward pass over a paged KV pool [L, 2, N, S, Hk, D]."""

    def __init__(
        self, spec: ModelSpec, weights: dict[str, torch.Tensor], ops: ModuleType,
        max_position: int | None = None,
    ) -> None:
        missing = set(weight_shapes(spec)) - set(weights)
        if missing:
            raise ValueError(f"weights missing: {sorted(missing)[:5]}")
        self.spec = spec
        self.ops = ops
        self.w = weights
        self.layers = [
            {k[len(f"layers.{l}."):]: v for k, v in weights.items() if k.startswith(f"layers.{l}.")}
            for l in range(spec.num_layers)
        ]
        device = weights["embed"].device
        self.max_position = max_position or spec.max_position_embeddings
        self.cos_sin = ops.rope_cos_sin(
            spec.head_dim, self.max_position, spec.rope_theta, spec.rope_scaling
        ).to(device)
        self.scale = spec.head_dim**-0.5
        kv = spec.num_kv_heads * spec.head_dim
        self._split = [spec.num_heads * spec.head_dim, kv, kv]

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata,
        kv_pool: torch.Tensor, layer_hook: LayerHook | None = None,
    ) -> torch.Tensor:
        """Run all layers over T tokens; returns final-normed hidden states [len(idx), H]."""
        eps = self.spec.rms_norm_eps
        h = F.embedding(input_ids, self.w["embed"])
        residual: torch.Tensor | None = None
        ops, layers = self.ops, self.layers
        for l, lw in enumerate(layers):
            # each norm runs inside the projection after it (one kernel at batch 1), and each
            # projection names the next one's weight (warmed into L2 at batch 1)
            after = layers[l + 1]["qkv"] if l + 1 < len(layers) else self.w["lm_head"]
            qkv, residual = ops.norm_linear(h, lw["in_norm"], eps, residual, lw["qkv"], lw.get("qkv_bias"),
                                            prefetch=lw["o"])
            h = self._attention(l, lw, qkv, positions, meta, kv_pool, layer_hook)
            if "router" in lw:
                h, residual = self._moe(lw, h, residual)
                continue
            act, residual = ops.norm_glu(h, lw["post_norm"], eps, residual, lw["gate_up"], prefetch=lw["down"])
            h = ops.linear(act, lw["down"], prefetch=after)
        if meta.logits_indices is not None:
            # Only the sampled tokens need the final norm and the (large) lm_head.
            h, residual = h[meta.logits_indices], residual[meta.logits_indices]  # type: ignore[index]
        out, _ = self.ops.rms_norm(h, self.w["norm"], eps, residual)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, H] -> logits [n, V] in the weights' dtype: a greedy pick needs no float32 copy
        (2 bytes more per logit; 0.1 ms a step at batch 256 x 128k vocab); sample_tokens and
        verify_drafts upcast the rows that need float32."""
        return self.ops.linear(hidden, self.w["lm_head"])

    def _moe(
        self, lw: dict[str, torch.Tensor], h: torch.Tensor, residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A routed MLP: each token's top-k experts, weighted by their router probabilities
        (plus Qwen2-MoE's shared expert, scaled by a sigmoid gate)."""
        spec, ops = self.spec, self.ops
        x, residual = ops.rms_norm(h, lw["post_norm"], spec.rms_norm_eps, residual)
        weights, ids = ops.moe_route(ops.linear(x, lw["router"]), spec.num_experts_per_tok, spec.norm_topk_prob)
        out = ops.moe_experts(x, weights, ids, lw["experts_gate_up"], lw["experts_down"])
        if "shared_gate_up" in lw:
            shared = ops.linear(ops.silu_and_mul(ops.linear(x, lw["shared_gate_up"])), lw["shared_down"])
            out = out + torch.sigmoid(ops.linear(x, lw["shared_gate"])) * shared
        return out, residual

    def _attention(
        self, l: int, lw: dict[str, torch.Tensor], qkv: torch.Tensor, positions: torch.Tensor,
        meta: AttnMetadata, kv_pool: torch.Tensor, layer_hook: LayerHook | None,
    ) -> torch.Tensor:
        spec, ops = self.spec, self.ops
        t, d = qkv.shape[0], spec.head_dim
        q, k, v = qkv.split(self._split, dim=-1)
        q = q.reshape(t, spec.num_heads, d)
        k = k.reshape(t, spec.num_kv_heads, d)
        v = v.reshape(t, spec.num_kv_heads, d)
        if spec.qk_norm:
            # per-head norm: the kernels take 2-D rows, so fold heads into rows
            q = ops.rms_norm(q.reshape(-1, d), lw["q_norm"], spec.rms_norm_eps)[0].view(t, -1, d)
            k = ops.rms_norm(k.reshape(-1, d), lw["k_norm"], spec.rms_norm_eps)[0].view(t, -1, d)
        # a quantized pool (fp8/int8 rows + scales, runtime/kv_quant.py) adds scale views
        k_cache, v_cache, *scales = layer_views(kv_pool, l, d)
        quant = tuple(scales) if scales[0] is not None else ()
        if meta.is_decode:
            # rotary, KV write and attention: one kernel on CUDA
            o = ops.decode_rotary_attention(
                q, k, v, positions, self.cos_sin, k_cache, v_cache, meta.slot_mapping,
                meta.block_tables, meta.seq_lens, self.scale, *quant,
            )
            if layer_hook is not None:
                layer_hook(l)
        else:
            # the rotated k goes straight into the cache (one kernel on CUDA)
            q = ops.rotary_write_kv(q, k, v, positions, self.cos_sin, k_cache, v_cache, meta.slot_mapping, *quant)
            if layer_hook is not None:
                layer_hook(l)
            o = ops.paged_prefill_attention(
                q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                self.scale, *quant,
            )
        return ops.linear(o.reshape(t, spec.num_heads * d), lw["o"], lw.get("o_bias"), prefetch=lw.get("gate_up"))
