"""Plain-torch twins of every kernel in this package.

The CPU path runs these directly; the Triton kernels are tested against them. Shapes:
T tokens in a step, B sequences, Hq query heads, Hk KV heads, D head dim, N blocks of
S tokens. The paged cache of one layer is `k_cache`/`v_cache` of shape [N, S, Hk, D].

Quantized KV (fp8 e4m3 or int8 storage): `k_scale`/`v_scale` [N, S, Hk] float32 hold one scale
per (token, KV head); a stored row x_q dequantizes to x_q * scale. Every op taking them
defaults them to None (unquantized cache of the query's dtype).
"""

from __future__ import annotations

import math

import torch


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm with a fused residual add: returns (norm(x + residual) * weight, x + residual)."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype), x


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           prefetch: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight^T (+ bias): the model's every projection. `prefetch` names the weight used
    next (the Triton twin warms it into L2); nothing to do here."""
    return torch.nn.functional.linear(x, weight, bias)


def norm_linear(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
    weight: torch.Tensor, bias: torch.Tensor | None = None, prefetch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm then linear: (linear(norm(x + residual) * norm_weight), x + residual)."""
    normed, summed = rms_norm(x, norm_weight, eps, residual)
    return linear(normed, weight, bias), summed


def norm_glu(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
    weight: torch.Tensor, bias: torch.Tensor | None = None, prefetch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """norm_linear over a [gate; up] weight, then silu_and_mul: (silu(g) * u, x + residual)."""
    out, summed = norm_linear(x, norm_weight, eps, residual, weight, bias)
    return silu_and_mul(out), summed


def rope_cos_sin(
    head_dim: int,
    max_position: int,
    base: float,
    scaling: dict | None = None,
    partial_rotary_factor: float = 1.0,
) -> torch.Tensor:
    """Cos/sin table [max_position, rotary_dim] (cos in the first half, sin in the second).

    `scaling` is the HF `rope_scaling` dict; "llama3" (Llama 3.1) and "linear" are understood.
    """
    rot = int(head_dim * partial_rotary_factor)
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)  # type: ignore[arg-type]
    elif kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])  # type: ignore[index]
    elif kind not in (None, "default"):
        raise ValueError(f"rope_scaling type {kind!r} is not supported")
    t = torch.arange(max_position, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(mid, smoothed, out)


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style (HF rotate_half) rotary embedding of q [T, Hq, D] and k [T, Hk, D]."""
    cs = cos_sin[positions]
    half = cs.shape[-1] // 2
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rot = cos.shape[-1] * 2
    xr, xpass = x[..., :rot].float(), x[..., rot:]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    return torch.cat([out, xpass], dim=-1) if xpass.numel() else out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> silu(x[:, :I]) * x[:, I:]."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def moe_route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64): the softmax
    over all experts (in float32), its k largest, renormalized to sum to 1 if asked."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def moe_experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """Routed experts: sum over j of weights[t, j] * down[e] @ silu_and_mul(gate_up[e] @ x[t])
    with e = ids[t, j]. x [T, H], gate_up [E, 2I, H], down [E, H, I] -> [T, H] in x's dtype."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)
        y = linear(silu_and_mul(linear(x[rows], gate_up[e])), down[e])
        out.index_add_(0, rows, y.float() * weights[rows, slot, None])
    return out.to(x.dtype)


QUANT_MAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}
SCALE_FLOOR = 1e-8


def quantize_rows(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row quantization of x [..., D]: (x_q [..., D] of `dtype`, scale [...]).

    scale = max(amax / QMAX, 1e-8); int8 rounds half away from zero (floor(x + 0.5)).
    """
    qmax = QUANT_MAX[dtype]
    xf = x.float()
    scale = torch.clamp(xf.abs().amax(-1) / qmax, min=SCALE_FLOOR)
    xq = (xf / scale[..., None]).clamp(-qmax, qmax)
    if dtype == torch.int8:
        xq = torch.floor(xq + 0.5).clamp(-qmax, qmax)
    return xq.to(dtype), scale


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store k, v [T, Hk, D] into the paged cache at flat slots (block * S + offset).

    With scales, rows are quantized to the cache dtype and their scales stored beside them.
    """
    if k_scale is None or v_scale is None:
        n, s = k_cache.shape[0], k_cache.shape[1]
        k_cache.view(n * s, *k_cache.shape[2:])[slot_mapping] = k.to(k_cache.dtype)
        v_cache.view(n * s, *v_cache.shape[2:])[slot_mapping] = v.to(v_cache.dtype)
        return
    blk, off = slot_mapping.long() // k_cache.shape[1], slot_mapping.long() % k_cache.shape[1]
    for x, cache, sc in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        xq, scale = quantize_rows(x, cache.dtype)
        cache[blk, off] = xq
        sc[blk, off] = scale


def rotary_write_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """rotary, then write_kv of the rotated k and v: returns the rotated q."""
    q, k = rotary(q, k, positions, cos_sin)
    write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q


def dequantize_cache(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """float32 values of a cache [N, S, Hk, D] (times its [N, S, Hk] scales when quantized)."""
    if scale is None:
        return cache.float()
    return cache.float() * scale[..., None]


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    """dst[:, dst_ids[i]] = src[:, src_ids[i]] for every i: whole blocks of one layer's planes."""
    raw_dst, raw_src = dst.view(torch.uint8), src.view(torch.uint8)  # any dtype, bit for bit
    raw_dst.index_copy_(1, dst_ids.long(), raw_src.index_select(1, src_ids.long()))


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, length: int
) -> torch.Tensor:
    """The first `length` tokens of one sequence from a paged cache: [length, Hk, D]."""
    s = cache.shape[1]
    nblocks = (length + s - 1) // s
    return cache[block_table[:nblocks].long()].flatten(0, 1)[:length]


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a batch of query runs over their paged KV.

    Sequence b owns queries q[query_start_loc[b]:query_start_loc[b+1]], which are its last
    tokens: positions seq_lens[b] - n_b ... seq_lens[b] - 1. Its KV (cached prefix and the new
    tokens, already written) lies in blocks block_tables[b]. Returns [T, Hq, D].
    """
    if k_scale is not None and v_scale is not None:
        k_cache, v_cache = dequantize_cache(k_cache, k_scale), dequantize_cache(v_cache, v_scale)
    out = torch.empty_like(q)
    hq, hk = q.shape[1], k_cache.shape[2]
    qsl, lens = query_start_loc.tolist(), seq_lens.tolist()
    for b, total in enumerate(lens):
        lo, hi = qsl[b], qsl[b + 1]
        if hi == lo:
            continue
        k = gather_kv(k_cache, block_tables[b], total).float()
        v = gather_kv(v_cache, block_tables[b], total).float()
        k = k.repeat_interleave(hq // hk, dim=1)
        v = v.repeat_interleave(hq // hk, dim=1)
        qb = q[lo:hi].float()
        scores = torch.einsum("qhd,khd->hqk", qb, k) * scale
        qpos = torch.arange(total - (hi - lo), total, device=q.device)[:, None]
        mask = torch.arange(total, device=q.device)[None, :] > qpos
        scores.masked_fill_(mask[None], float("-inf"))
        probs = scores.softmax(-1)
        out[lo:hi] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence (q [B, Hq, D]) over seq_lens[b] cached tokens."""
    qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return paged_prefill_attention(
        q, k_cache, v_cache, block_tables, seq_lens, qsl, scale, k_scale, v_scale
    )


def decode_rotary_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """rotary_write_kv, then paged_decode_attention of the rotated q (one decode step's layer)."""
    q = rotary_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale)


def nucleus_threshold(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Per row of logits [B, V], the smallest logit sampling keeps (float32 [B]): the k-th
    largest (top_k[b] < 1 or >= V: off; ties with it stay), then, over the softmax of
    logits / temperature[b] renormalised over those, the smallest logit of the shortest
    most-likely run whose mass reaches top_p[b] (>= 1: off); the most likely token always stays."""
    x = logits.float()
    s, _ = x.sort(dim=-1, descending=True)
    v = x.shape[-1]
    k = torch.where((top_k >= 1) & (top_k < v), top_k, v).long()
    kept = s >= s.gather(1, (k - 1)[:, None])  # the top k and any ties with the k-th
    sp = (s / temperature[:, None]).masked_fill(~kept, float("-inf")).softmax(dim=-1)
    before = sp.cumsum(dim=-1) - sp  # mass of the more likely tokens
    kept &= (before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    return s.gather(1, (kept.sum(dim=-1) - 1)[:, None]).squeeze(1)


def top_p_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The distribution kernels.sample.sample_top_p draws each row from (float64 [B, V]):
    softmax(logits / temperature[b]) over the tokens whose strictly more likely mass is under
    top_p[b] (>= 1: every token), renormalised; tokens of equal logit are kept together."""
    x = logits.double() / temperature.double()[:, None]
    probs = x.softmax(dim=-1)
    asc, order = x.sort(dim=-1)
    upto = probs.gather(1, order).cumsum(dim=-1)  # mass of the tokens at or below each, ascending
    at_or_below = upto.gather(1, torch.searchsorted(asc, x, right=True) - 1)
    above = (upto[:, -1:] - at_or_below).clamp(min=0.0)
    kept = (above < top_p.double()[:, None]) | (top_p[:, None] >= 1.0)
    probs = probs * kept
    return probs / probs.sum(dim=-1, keepdim=True)


def apply_penalties(
    logits: torch.Tensor, out: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, counts: torch.Tensor,
    in_prompt: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor,
) -> None:
    """out[rows[i]] = logits[rows[i]] with request slots[i]'s penalties (its counts [slots, V] of
    generated tokens, its in-prompt mask [slots, V] uint8; rep/freq/pres [R] float32): a token
    generated or in the prompt has its logit divided by rep if positive, else multiplied by it;
    then freq * count + pres * [count > 0] is subtracted. Computed in float32; out may be logits."""
    x = logits.index_select(0, rows).float()
    n = counts.index_select(0, slots)
    seen = in_prompt.index_select(0, slots).bool() | (n > 0)
    x = torch.where(seen, torch.where(x > 0, x / rep[:, None], x * rep[:, None]), x)
    x = x - freq[:, None] * n - pres[:, None] * (n > 0)
    out.index_copy_(0, rows, x.to(out.dtype))
