"""A draft model of known quality on random weights, for timing draft-model speculation.

Two random-weight models have nothing in common, so a draft would have nothing accepted. Here
the target keeps its shape and its cost per step, but its layers from `layers` on get zero
output projections (attention `o` and MLP `down`, biases too): they still read their weights
and the KV cache, and add nothing to the residual stream. The target then computes the same
function as its first `layers` layers, and the draft is exactly those layers (the target's
config with num_layers = layers, the same tensors): its greedy tokens are the target's. A
`noise` > 0 adds Gaussian noise, `noise` times the head's own standard deviation, to the
draft's lm_head (a copy), which lowers the share of drafts accepted.
"""

from __future__ import annotations

import dataclasses

import torch

from pdserve.runtime.runner import ModelRunner

SILENCED = ("o", "o_bias", "down")  # the projections into the residual stream


def silence_layers_from(target: ModelRunner, layers: int) -> None:
    """Zero (in place) the output projections of target's layers >= `layers`."""
    if not 1 <= layers < target.spec.num_layers:
        raise ValueError(f"layers must be in [1, {target.spec.num_layers - 1}], got {layers}")
    for layer in range(layers, target.spec.num_layers):
        for name in SILENCED:
            w = target.model.w.get(f"layers.{layer}.{name}")
            if w is not None:
                w.zero_()


def layer_draft(target: ModelRunner, layers: int, *, noise: float = 0.0, seed: int = 0,
                num_blocks: int, max_num_seqs: int = 256) -> ModelRunner:
    """A ModelRunner of the target's first `layers` layers with the target's weights (copied,
    on its device and dtype), its lm_head perturbed by `noise` (see the module docstring)."""
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    spec = dataclasses.replace(target.spec, num_layers=layers, name=f"{target.spec.name}-first-{layers}")
    draft = ModelRunner(spec, None, device=target.device, dtype=target.dtype, num_blocks=num_blocks,
                        block_size=target.block_size, load_format="dummy", max_model_len=target.max_model_len,
                        max_num_seqs=max_num_seqs)
    with torch.no_grad():
        for name, w in draft.model.w.items():
            w.copy_(target.model.w[name])
        if noise > 0:
            head = draft.model.w["lm_head"]
            gen = torch.Generator(device=head.device).manual_seed(seed)
            std = head.float().std().item()
            head.add_(torch.randn(head.shape, generator=gen, device=head.device, dtype=head.dtype) * (noise * std))
    return draft
