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

from pdserve.kernels._attention import fp8_bits_to_fp16_int, fp8_bits_to_fp16_ptx
from pdserve.kernels.decode_attention import decode_with_partitions
from pdserve.model.spec import ModelSpec
from pdserve.runtime.kv_quant import allocate_quant_pool, layer_views

HQ, HK, D, S = 32, 8, 128, 16


@triton.jit
def _ld(ptr, mask, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(ptr)
    else:
        return tl.load(ptr, mask=mask, other=0)


@triton.jit
def _cvt_gain(CVT: tl.constexpr):
    """The bit-shift upcasts (CVT 1, 2) give fp16 values 2^-8 of the fp8 ones: scales undo it."""
    if CVT == 0:
        return 1.0
    else:
        return 256.0


@triton.jit
def _upcast(x, up, CVT: tl.constexpr):
    """fp8 e4m3 (or bf16) tile -> the dot type. CVT 0: Triton's convert; 1: the kernels' bit
    moves as integer ops (values 2^-8 of the true ones, exact); 2: the same in PTX."""
    if CVT == 0 or x.dtype == tl.bfloat16:
        return x.to(up)
    elif CVT == 1:
        return fp8_bits_to_fp16_int(x)
    else:
        return fp8_bits_to_fp16_ptx(x)


@triton.jit
def _probe_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_cn, stride_cs, stride_ch, stride_bt, stride_sn, stride_ss, stride_sh,
    scale_log2,
    G: tl.constexpr, G_PAD: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    KT: tl.constexpr, QK8: tl.constexpr, NOSCALE: tl.constexpr, UP_BF16: tl.constexpr,
    EVEN: tl.constexpr, FUSE: tl.constexpr, CVT: tl.constexpr,
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
        page = _ld(bt_row + t // S, tmask, EVEN).to(tl.int64)
        slot = (t % S).to(tl.int64)
        tok_off = page * stride_cn + slot * stride_cs
        sc_off = page * stride_sn + slot * stride_ss + kvh * stride_sh
        if EVEN:
            k = tl.load(kc_ptr + tok_off[None, :] + head_off[:, None])
        elif KT:
            k = tl.trans(tl.load(kc_ptr + tok_off[:, None] + head_off[None, :], mask=tmask[:, None], other=0.0))
        else:
            k = tl.load(kc_ptr + tok_off[None, :] + head_off[:, None], mask=tmask[None, :], other=0.0)
        if not QK8:
            k = _upcast(k, up, CVT)
        s = tl.dot(q, k)
        if QK8:
            s = s * qs[:, None]
        if FUSE:
            if NOSCALE:
                s = s * scale_log2
            else:
                s = s * (_ld(ks_ptr + sc_off, tmask, EVEN) * (scale_log2 * _cvt_gain(CVT)))[None, :]
        else:
            s = s * scale_log2
            if not NOSCALE:
                s = s * (_ld(ks_ptr + sc_off, tmask, EVEN) * _cvt_gain(CVT))[None, :]
        if not EVEN:
            s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if EVEN:
            v = tl.load(vc_ptr + tok_off[:, None] + head_off[None, :])
        else:
            v = tl.load(vc_ptr + tok_off[:, None] + head_off[None, :], mask=tmask[:, None], other=0.0)
        v = _upcast(v, up, CVT)
        if not NOSCALE:
            p = p * (_ld(vs_ptr + sc_off, tmask, EVEN) * _cvt_gain(CVT))[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(up), v)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=gmask[:, None])


def probe(q, kc, vc, ks, vs, tables, lens, scale, *, kt=False, qk8=False, noscale=False, up_bf16=False,
          block_n=128, warps=4, stages=2, even=False, fuse=False, cvt=0) -> torch.Tensor:
    out = torch.empty_like(q)
    _probe_kernel[(q.shape[0], HK)](
        q, kc, vc, ks, vs, tables, lens, out,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), tables.stride(0),
        *ks.stride()[:3], scale * math.log2(math.e),
        G=HQ // HK, G_PAD=16, S=S, D=D, BLOCK_N=block_n, KT=kt, QK8=qk8, NOSCALE=noscale, UP_BF16=up_bf16,
        EVEN=even, FUSE=fuse, CVT=cvt, num_warps=warps, num_stages=stages)
    return out


def report(label: str, fn, ref: torch.Tensor, nbytes: int) -> None:
    """Print fn's median time, bandwidth over nbytes and max abs error to ref; a variant that
    does not compile (or runs out of resources) is reported, not fatal."""
    try:
        err = (fn().float() - ref.float()).abs().max().item()
        ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
        print(f"{label}: {ms:.3f} ms {nbytes / ms / 1e6:.0f} GB/s err {err:.2e}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"{label}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)


def main(quick: bool = False, sweep: bool = False, regs: bool = False) -> None:
    """quick: only the real kernel, over bf16 and fp8 pools, with each tiles= choice;
    sweep: also the real kernel's tile, warps and stages; regs: only the fp8 real kernel with
    register caps (and the bf16/fp8 baselines)."""
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
        if regs:  # occupancy: uncapped, 138 registers and 42.5 KB of shared memory let 3 programs share an SM
            # (block_n, stages, maxnreg, warps); session 9 found (128, 2, 128, 4) best of the first eight
            for bn, stages, nreg, warps in ((128, 2, 128, 4), (128, 3, None, 4), (128, 2, 112, 4), (128, 2, 128, 8),
                                            (256, 2, 128, 8), (256, 2, 96, 8), (128, 2, 80, 4), (128, 2, 128, 4)):
                kw = dict(block_n=bn, num_stages=stages, max_registers=nreg, num_warps=warps)
                ms = do_bench(lambda: decode_with_partitions(q, views.k, views.v, tables, lens, scale, ctx,  # noqa: B023
                                                             views.k_scale, views.v_scale, **kw),  # noqa: B023
                              warmup=25, rep=200, return_mode="median")
                err = (decode_with_partitions(q, views.k, views.v, tables, lens, scale, ctx, views.k_scale,
                                              views.v_scale, **kw).float() - ref.float()).abs().max().item()
                print(f"{seqs}x{ctx} fp8 real kernel {kw}: {ms:.3f} ms "
                      f"{nbytes / ms / 1e6:.0f} GB/s err {err:.1e}", flush=True)
            continue
        for dt, args, mb in (("bf16", (bf_pool[0], bf_pool[1]), bf_bytes), ("fp8", (views.k, views.v), nbytes)):
            sc = (views.k_scale, views.v_scale) if dt == "fp8" else (None, None)
            for tiles in ("masked", "tail", "soft") if dt == "fp8" else ("masked", "tail"):
                ms = do_bench(lambda: decode_with_partitions(q, *args, tables, lens, scale, ctx, *sc,  # noqa: B023
                                                             tiles=tiles),
                              warmup=25, rep=200, return_mode="median")
                print(f"{seqs}x{ctx} {dt} real kernel tiles={tiles}: {ms:.3f} ms "
                      f"{mb / ms / 1e6:.0f} GB/s", flush=True)
            for heads_first in (False, True, False, True):
                ms = do_bench(lambda: decode_with_partitions(q, *args, tables, lens, scale, ctx, *sc,  # noqa: B023
                                                             heads_first=heads_first),  # noqa: B023
                              warmup=25, rep=200, return_mode="median")
                print(f"{seqs}x{ctx} {dt} real kernel heads_first={heads_first}: {ms:.3f} ms "
                      f"{mb / ms / 1e6:.0f} GB/s", flush=True)
        if sweep:
            for dt, args, mb in (("bf16", (bf_pool[0], bf_pool[1]), bf_bytes), ("fp8", (views.k, views.v), nbytes)):
                sc = (views.k_scale, views.v_scale) if dt == "fp8" else (None, None)
                for bn, warps, stages in ((64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (128, 4, 4),
                                          (128, 8, 2), (128, 8, 3), (256, 8, 2)):
                    ms = do_bench(lambda: decode_with_partitions(q, *args, tables, lens, scale, ctx, *sc,  # noqa: B023
                                                                 block_n=bn, num_warps=warps, num_stages=stages),  # noqa: B023
                                  warmup=25, rep=200, return_mode="median")
                    print(f"{seqs}x{ctx} {dt} real kernel block_n={bn} warps={warps} stages={stages}: {ms:.3f} ms "
                          f"{mb / ms / 1e6:.0f} GB/s", flush=True)
        if quick:
            continue
        for kw in (dict(), dict(even=True), dict(even=True, stages=3)):
            fn = lambda: probe(q, bf_pool[0], bf_pool[1], views.k_scale, views.v_scale, tables, lens, scale,  # noqa: E731
                               noscale=True, up_bf16=True, block_n=64, **kw)
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            print(f"{seqs}x{ctx} bf16 probe {kw}: {ms:.3f} ms {bf_bytes / ms / 1e6:.0f} GB/s", flush=True)
        variants = [dict(), dict(noscale=True), dict(even=True), dict(even=True, fuse=True),
                    dict(even=True, fuse=True, cvt=1), dict(even=True, fuse=True, cvt=2), dict(cvt=2),
                    dict(even=True, fuse=True, qk8=True), dict(even=True, fuse=True, cvt=2, stages=3),
                    dict(even=True, fuse=True, cvt=2, block_n=64), dict(even=True, fuse=True, cvt=2, block_n=256, warps=8),
                    dict(even=True, fuse=True, noscale=True), dict(even=True, fuse=True, cvt=2, noscale=True)]
        for kw in variants:
            report(f"{seqs}x{ctx} probe {kw}", lambda: probe(q, views.k, views.v, views.k_scale,  # noqa: B023
                   views.v_scale, tables, lens, scale, **kw), ref, nbytes)  # noqa: B023


if __name__ == "__main__":
    import sys

    main(quick="--quick" in sys.argv or "--sweep" in sys.argv, sweep="--sweep" in sys.argv,
         regs="--regs" in sys.argv)
