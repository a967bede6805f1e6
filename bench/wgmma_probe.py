"""Probe (diagnostic, not served): fp8 paged decode attention with the KV tile as the dots' M
dimension, so Hopper's warpgroup MMA (wgmma, M = 64 per warpgroup) can take the K tile as fp8
straight from shared memory: S^T [N, G] = K [N, D] @ Q^T [D, G], the query rounded to fp8 in
two parts (hi + lo, about 7 mantissa bits together) so no K element is ever converted. V goes
through O^T [D, G] += V^T [D, N] @ P^T [N, G] with V upcast to fp16 (wgmma reads 16-bit
operands transposed from shared memory).

    PYTHONPATH=DIR_WITH_TRITON_3.6:. python bench/wgmma_probe.py --sass     # offline sm_90 SASS
    python bench/wgmma_probe.py                                              # GPU: check + time

Result (session 21, 2026-12-06): Triton 3.6 emits QGMMA for the score dots and HGMMA for P@V,
991 instructions per 128-token tile against the served kernel's 1,350, yet on an H100 at
256 x 4k it takes 0.894 ms against the served kernel's 0.778 ms (64 x 4k: 0.238 vs 0.212 ms;
`bench/results/wgmma-probe-h100-2026-12-06-s21a-*.json`). The same form built into the served
kernel (tokens spread over the warps, so the tile's max is a cross-warp reduction; 73 KB of
shared memory, 3 programs per SM; a query in three fp8 parts) took 0.918 ms uncapped and 7.5 ms
at the served kernel's 128-register cap (spills), and 0.23x of bf16 through the engine loop at
that cap (`kvquant-loop-h100-2026-12-06-s21a.json`, commit fcae717): dropped. With a query in
one fp8 part (hi_only) the output error doubles; P rounded to fp8 for an fp8 P@V (qlo_v8) is
both slower (1.62 ms: V^T must be transposed byte by byte into shared memory) and wrong (max
error 0.23 on outputs of 0.35: probabilities times small V scales fall below fp8's range).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _wg_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_cn, stride_ch, stride_cs, stride_sn, stride_sh, stride_ss, stride_bt,
    stride_ob, stride_oh, scale_log2,
    G: tl.constexpr, G_PAD: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    QLO: tl.constexpr, V_FP16_DOT: tl.constexpr,
):
    kvh = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qb + (kvh * G + g)[:, None] * stride_qh + d[None, :],
                mask=(g < G)[:, None], other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(q), 1), 1e-12)
    qs = q * (448.0 / amax)[:, None]
    q_hi = qs.to(tl.float8e4nv)
    q_lo = ((qs - q_hi.to(tl.float32)) * 16.0).to(tl.float8e4nv)
    qt_hi = tl.trans(q_hi)
    qt_lo = tl.trans(q_lo)
    col_scale = amax * (scale_log2 / 448.0)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([D, G_PAD], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    last_page = tl.maximum(seq_len - 1, 0) // S
    for t0 in range(0, seq_len, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        page = tl.load(bt_row + tl.minimum(t // S, last_page)).to(tl.int64)
        slot = (t % S).to(tl.int64)
        tok = page * stride_cn + kvh * stride_ch + slot * stride_cs
        sc = page * stride_sn + kvh * stride_sh + slot * stride_ss
        k = tl.load(kc_ptr + tok[:, None] + d[None, :])
        st = tl.dot(k, qt_hi)
        if QLO:
            st = st + tl.dot(k, qt_lo) * 0.0625
        tmask = t < seq_len
        st = st * tl.load(ks_ptr + sc)[:, None] * col_scale[None, :]
        st = tl.where(tmask[:, None], st, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(st, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(st - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        vs = tl.where(tmask, tl.load(vs_ptr + sc), 0.0)
        v = tl.load(vc_ptr + tok[:, None] + d[None, :])
        pv = p * vs[:, None]
        if V_FP16_DOT:
            acc = acc * alpha[None, :] + tl.dot(tl.trans(v.to(tl.float16)), pv.to(tl.float16))
        else:
            acc = acc * alpha[None, :] + tl.dot(tl.trans(v), pv.to(tl.float8e4nv))
        m_i = m_new
    out = tl.trans(acc / l_i[None, :])
    tl.store(out_ptr + b * stride_ob + (kvh * G + g)[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(g < G)[:, None])


CONSTS = dict(G=4, G_PAD=16, S=16, D=128, BLOCK_N=128, QLO=True, V_FP16_DOT=True)
PTRS = {"q_ptr": "*bf16", "kc_ptr": "*fp8e4nv", "vc_ptr": "*fp8e4nv", "ks_ptr": "*fp32", "vs_ptr": "*fp32",
        "bt_ptr": "*i32", "lens_ptr": "*i32", "out_ptr": "*bf16"}


def offline(variants: dict[str, dict], kernel=_wg_kernel, consts: dict = CONSTS) -> None:
    """sm_90 SASS report of each variant ({"c": constexprs, "w": warps, "st": stages}) of a probe
    kernel with _wg_kernel's arguments (bench/pair_probe.py's too)."""
    from sass_offline import report, sass

    for name, extra in variants.items():
        report(name, sass(kernel, PTRS, {**consts, **extra.get("c", {})}, num_warps=extra.get("w", 4),
                          num_stages=extra.get("st", 2)), top=40)


def run(q, kc, vc, ks, vs, bt, lens, consts: dict, warps: int, stages: int, maxnreg: int | None = None,
        kernel=_wg_kernel, base: dict = CONSTS, unit: int = 1) -> torch.Tensor:
    """q [B, H, D] bf16; kc/vc [P, S, Hk, D] fp8 and ks/vs [P, S, Hk] fp32: kv_quant's layer views.
    The cache strides go to the kernel in units of `unit` bytes."""
    B, H, D = q.shape
    hk = kc.shape[2]
    assert all(s % unit == 0 for s in kc.stride()[:3]) and kc.stride() == vc.stride() and kc.data_ptr() % 4 == 0
    out = torch.empty_like(q)
    c = {**base, **consts, "G": H // hk, "S": kc.shape[1], "D": D}
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    kernel[(hk, B)](q, kc, vc, ks, vs, bt, lens, out, q.stride(0), q.stride(1), kc.stride(0) // unit,
                    kc.stride(2) // unit, kc.stride(1) // unit, ks.stride(0), ks.stride(2), ks.stride(1),
                    bt.stride(0), out.stride(0), out.stride(1), D ** -0.5 * 1.4426950408889634, num_warps=warps,
                    num_stages=stages, **extra, **c)
    return out


def inputs(B: int, ctx: int, H: int = 32, D: int = 128) -> tuple[torch.Tensor, ...]:
    """Seeded probe inputs on the GPU: q [B, H, D] bf16, an fp8 layer (kc, vc, ks, vs, tables)
    of B sequences of ctx tokens (kernel_bench.quant_paged), and the lengths."""
    sys.path.insert(0, "bench")
    from kernel_bench import quant_paged

    torch.manual_seed(0)
    kc, vc, ks, vs, bt = quant_paged(B, ctx, "fp8_e4m3")
    ks.uniform_(0.001, 0.02)  # random bytes make wild scales; realistic ones keep softmax soft
    vs.uniform_(0.001, 0.02)
    lens = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
    q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
    return q, kc, vc, ks, vs, bt, lens


def gpu(args) -> dict:
    import statistics

    from pdserve.kernels import reference
    from pdserve.kernels.decode_attention import paged_decode_attention

    B, D, ctx = args.batch, 128, args.ctx
    q, kc, vc, ks, vs, bt, lens = inputs(B, ctx)
    res: dict = {"batch": B, "ctx": ctx, "gpu": torch.cuda.get_device_name(), "kv_bytes": kc.numel() * 2 + ks.numel() * 8}
    chk = slice(0, 4)
    ref = reference.paged_decode_attention(q[chk], kc, vc, bt[chk], lens[chk], D ** -0.5, ks, vs)
    calls = {"ours": lambda: paged_decode_attention(q, kc, vc, bt, lens, D ** -0.5, ks, vs)}
    for name, (consts, warps, stages, reg) in {
        "qlo_v16": ({}, 4, 2, None), "qlo_v16_r128": ({}, 4, 2, 128), "qlo_v16_s3": ({}, 4, 3, None),
        "hi_only_v16": ({"QLO": False}, 4, 2, None), "qlo_v8": ({"V_FP16_DOT": False}, 4, 2, None),
        "qlo_v16_n64": ({"BLOCK_N": 64}, 4, 2, None), "qlo_v16_w8": ({}, 8, 2, None),
    }.items():
        calls[name] = lambda c=consts, w=warps, st=stages, r=reg: run(q, kc, vc, ks, vs, bt, lens, c, w, st, r)
    ok = {}
    for name, fn in calls.items():
        try:
            out = fn()
            torch.cuda.synchronize()
            ok[name] = fn
            res[name] = {"max_err": (out[chk].float() - ref.float()).abs().max().item(),
                         "ref_max": ref.float().abs().max().item()}
        except Exception as e:  # a variant that does not compile is a result too
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    times: dict[str, list[float]] = {n: [] for n in ok}
    for _ in range(args.rounds):  # interleaved rounds
        for name, fn in ok.items():
            times[name].append(triton.testing.do_bench(fn, warmup=10, rep=60))
    for name in ok:
        ms = statistics.median(times[name])
        res[name].update(ms=ms, ms_rounds=times[name], GBps=res["kv_bytes"] / ms / 1e6,
                         over_ours=statistics.median(times["ours"]) / ms)
    for name in calls:
        print(name, json.dumps(res[name])[:300], flush=True)
    return res


def cli(gpu_run, sass) -> None:
    """The probes' command line: --sass runs sass() (offline), else gpu_run(args) on the GPU and
    its results go to --out."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", action="store_true")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--probes", action="store_true", help="pair_probe: time the probe kernels too")
    args = ap.parse_args()
    if args.sass:
        sass()
        return
    res = gpu_run(args)
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)


def main() -> None:
    cli(gpu, lambda: offline({"q hi+lo, V fp16 dot": {}, "q hi only, V fp16 dot": {"c": {"QLO": False}},
                              "q hi+lo, V fp8 dot": {"c": {"V_FP16_DOT": False}}, "q hi+lo, 8 warps": {"w": 8},
                              "q hi+lo, 64-token tiles": {"c": {"BLOCK_N": 64}}}))


if __name__ == "__main__":
    sys.exit(main())
