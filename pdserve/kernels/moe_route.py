"""A mixture of experts' router (Triton twin of reference.moe_route): softmax over the experts,
the top k, renormalized if asked, one program per token in one launch (the torch chain is
six kernels: upcast, softmax, two of topk, sum, divide)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, check_device, check_dim, check_dtype, next_pow2


@triton.jit
def _moe_route_kernel(
    logits_ptr, w_ptr, ids_ptr, n_experts, stride_l,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, RENORM: tl.constexpr, BLOCK_E: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    live = e < n_experts
    x = tl.load(logits_ptr + t * stride_l + e, mask=live, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = tl.where(live, p / tl.sum(p, 0), -1.0)  # dead lanes below every probability
    slot = tl.arange(0, K_PAD)
    vals = tl.zeros([K_PAD], tl.float32)
    idx = tl.zeros([K_PAD], tl.int64)
    for j in tl.static_range(TOP_K):  # the largest left, the lowest index among equals
        best = tl.max(p, 0)
        at = tl.min(tl.where(p == best, e, BLOCK_E), 0)
        vals = tl.where(slot == j, best, vals)
        idx = tl.where(slot == j, at.to(tl.int64), idx)
        p = tl.where(e == at, -1.0, p)
    if RENORM:
        vals = vals / tl.sum(vals, 0)
    keep = slot < TOP_K
    tl.store(w_ptr + t * TOP_K + slot, vals, mask=keep)
    tl.store(ids_ptr + t * TOP_K + slot, idx, mask=keep)


def moe_route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64), largest first."""
    check_dim("logits", logits, 2)
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_device(logits=logits)
    t, n_experts = logits.shape
    assert 1 <= top_k <= n_experts, f"top_k {top_k} must be in [1, {n_experts}] (the experts)"
    assert logits.stride(1) == 1, f"logits must have unit stride in its last dim, strides {logits.stride()}"
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int64, device=logits.device)
    if t:
        _moe_route_kernel[(t,)](logits, weights, ids, n_experts, logits.stride(0), TOP_K=top_k,
                                K_PAD=next_pow2(top_k), RENORM=renormalize, BLOCK_E=next_pow2(n_experts),
                                num_warps=4 if n_experts >= 256 else 1)
    return weights, ids
