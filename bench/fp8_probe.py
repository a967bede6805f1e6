"""Where the fp8 paged decode attention spends its time (diagnostic, CUDA only).

`python bench/fp8_probe.py` times a stripped copy of pdserve/kernels/decode_attention.py's kernel (no
split-K: one program per sequence and KV head over the whole context) over an fp8 pool of the
Llama-3.1-8B head shape with switches: K loaded [N, D] then transposed (KT), the query quantized
to fp8 and QK done as an fp8 dot (QK8), the scales skipped (NOSCALE: wrong results, speed only),
the upcast type (UP), tile sizes and warps; beside the real kernel over bf16 and fp8 pools.
GB/s count the values and scales read; error is the max abs difference to the real fp8 kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from pdserve.kernels.decode_attention import decode_with_partitions
from pdserve.model.spec import ModelSpec
from pdserve.runtime.kv_quant import allocate_quant_pool, layer_views

HQ, HK, D, S = 32, 8, 128, 16


@triton.jit
def _probe_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_cn, stride_cs, stride_ch, stride_bt, stride_sn, stride_ss, stride_sh,
    scale_log2,
    G: tl.constexpr, G_PAD: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    KT: tl.constexpr, QK8: tl.constexpr, NOSCALE: tl.constexpr, UP_BF16: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    gmask = g < G
    heads = kvh * G + g
    up = tl.bfloat16 if UP_BF16 else tl.float16
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
    q = q.to(tl.float32)
    qs = tl.maximum(tl.max(tl.abs(q), 1), 1e-6) / 448.0
    if QK8:
        q = (q / qs[:, None]).to(tl.float8e4nv)
    else:
        q = q.to(up)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    head_off = kvh * stride_ch + d
    for t0 in range(0, seq_len, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        tmask = t < seq_len
        page = tl.load(bt_row + t // S, mask=tmask, other=0).to(tl.int64)
        slot = (t % S).to(tl.int64)
        tok_off = page * stride_cn + slot * stride_cs
        sc_off = page * stride_sn + slot * stride_ss + kvh * stride_sh
        if KT:
            k = tl.trans(tl.load(kc_ptr + tok_off[:, None] + head_off[None, :], mask=tmask[:, None], other=0.0))
        else:
            k = tl.load(kc_ptr + tok_off[None, :] + head_off[:, None], mask=tmask[None, :], other=0.0)
        if not QK8:
            k = k.to(up)
        s = tl.dot(q, k)
        if QK8:
            s = s * qs[:, None]
        s = s * scale_log2
        if not NOSCALE:
            s = s * tl.load(ks_ptr + sc_off, mask=tmask, other=0.0)[None, :]
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + tok_off[:, None] + head_off[None, :], mask=tmask[:, None], other=0.0).to(up)
        if not NOSCALE:
            p = p * tl.load(vs_ptr + sc_off, mask=tmask, other=0.0)[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(up), v)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=gmask[:, None])


def probe(q, kc, vc, ks, vs, tables, lens, scale, *, kt=False, qk8=False, noscale=False, up_bf16=False,
          block_n=128, warps=4, stages=2) -> torch.Tensor:
    out = torch.empty_like(q)
    _probe_kernel[(q.shape[0], HK)](
        q, kc, vc, ks, vs, tables, lens, out,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), tables.stride(0),
        *ks.stride()[:3], scale * math.log2(math.e),
        G=HQ // HK, G_PAD=16, S=S, D=D, BLOCK_N=block_n, KT=kt, QK8=qk8, NOSCALE=noscale, UP_BF16=up_bf16,
        num_warps=warps, num_stages=stages)
    return out


def main() -> None:
    spec = ModelSpec.from_config_dict({
        "model_type": "llama", "hidden_size": HQ * D, "intermediate_size": 256, "num_hidden_layers": 1,
        "num_attention_heads": HQ, "num_key_value_heads": HK, "vocab_size": 256})
    scale = D ** -0.5
    for seqs, ctx in ((256, 4096), (64, 4096)):
        need = ctx // S
        pool = allocate_quant_pool(spec, seqs * need, S, "fp8_e4m3", "cuda")
        pool.view(torch.uint8).random_(0, 120)
        views = layer_views(pool, 0, D)
        vals = views.k.view(torch.uint8)  # values from a small normal range, scales near 0.01
        vals.copy_((torch.randn(vals.shape, device="cuda") * 0.5).to(torch.float8_e4m3fn).view(torch.uint8))
        vals = views.v.view(torch.uint8)
        vals.copy_((torch.randn(vals.shape, device="cuda") * 0.5).to(torch.float8_e4m3fn).view(torch.uint8))
        views.k_scale.uniform_(0.005, 0.02)
        views.v_scale.uniform_(0.005, 0.02)
        tables = torch.randperm(seqs * need, device="cuda", dtype=torch.int32).view(seqs, need)
        lens = torch.full((seqs,), ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(seqs, HQ, D, device="cuda", dtype=torch.bfloat16)
        nbytes = seqs * ctx * HK * 2 * (D + 4)
        bf_pool = torch.randn(2, seqs * need, S, HK, D, device="cuda", dtype=torch.bfloat16)
        ref = decode_with_partitions(q, views.k, views.v, tables, lens, scale, ctx, views.k_scale, views.v_scale)
        ms = do_bench(lambda: decode_with_partitions(q, bf_pool[0], bf_pool[1], tables, lens, scale, ctx),
                      warmup=25, rep=200, return_mode="median")
        bf_bytes = seqs * ctx * HK * 2 * D * 2
        print(f"{seqs}x{ctx} bf16 real kernel: {ms:.3f} ms {bf_bytes / ms / 1e6:.0f} GB/s", flush=True)
        ms = do_bench(lambda: decode_with_partitions(q, views.k, views.v, tables, lens, scale, ctx, views.k_scale,
                                                     views.v_scale), warmup=25, rep=200, return_mode="median")
        print(f"{seqs}x{ctx} fp8 real kernel: {ms:.3f} ms {nbytes / ms / 1e6:.0f} GB/s", flush=True)
        variants = [dict(), dict(kt=True), dict(qk8=True), dict(qk8=True, kt=True), dict(noscale=True),
                    dict(up_bf16=True), dict(block_n=64), dict(block_n=256, warps=8), dict(warps=8),
                    dict(stages=3), dict(stages=4), dict(qk8=True, block_n=256, warps=8),
                    dict(qk8=True, stages=3), dict(kt=True, stages=3)]
        for kw in variants:
            try:
                fn = lambda: probe(q, views.k, views.v, views.k_scale, views.v_scale, tables, lens, scale, **kw)  # noqa: E731
                err = (fn().float() - ref.float()).abs().max().item()
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
                print(f"{seqs}x{ctx} probe {kw}: {ms:.3f} ms {nbytes / ms / 1e6:.0f} GB/s err {err:.2e}", flush=True)
            except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
                print(f"{seqs}x{ctx} probe {kw}: failed {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
