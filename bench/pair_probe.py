"""Probe (diagnostic, not served): fp8 paged decode attention that reads the cache as 16-bit
pairs of e4m3 bytes (d = 2j in the low byte, 2j + 1 in the high one), so Triton moves the
tiles from shared memory into the dot operands as it moves bf16 ones (ldmatrix), and splits
each pair into two fp16 tiles (even d, odd d) with the hardware e4m3x2 -> f16x2 convert
(`pdserve.kernels._attention.e4m3_pairs`, which the served kernel took from this probe). The
head dim is split the same way: S = Q_even K_even^T + Q_odd K_odd^T, and O_even += P V_even,
O_odd += P V_odd; the same MMA count as single dots over the whole head.

    PYTHONPATH=DIR_WITH_TRITON_3.6:. python bench/pair_probe.py --sass     # offline sm_90 SASS
    python bench/pair_probe.py [--out FILE]                                 # GPU: check + time

The GPU run times the served kernel with pairs (the default since 2026-12-07) and without
("old"), over fp8 and int8 caches (int8 pairs since 2026-12-07: `int8_pairs`), bf16, with
--probes the probe kernels too, and all of them over pages that stay in L2 (every sequence's
table names sequence 0's pages): the compute floor, which an H100 measures for an H200 too
(same SM).
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
import triton
import triton.language as tl
import wgmma_probe  # bench/ is on sys.path when run as a script

from pdserve.kernels._attention import e4m3_pairs


@triton.jit
def _pair_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_cn, stride_ch, stride_cs, stride_sn, stride_sh, stride_ss, stride_bt,
    stride_ob, stride_oh, scale_log2,
    G: tl.constexpr, G_PAD: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    V_PAIRS: tl.constexpr,
):
    """Cache strides in pairs (bytes / 2); V_PAIRS False: V through Triton's own convert."""
    kvh = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(lens_ptr + b)
    g = tl.arange(0, G_PAD)
    j = tl.arange(0, D // 2)
    rows = q_ptr + b * stride_qb + (kvh * G + g)[:, None] * stride_qh + 2 * j[None, :]
    gm = (g < G)[:, None]
    qe = tl.load(rows, mask=gm, other=0.0).to(tl.float16)
    qo = tl.load(rows + 1, mask=gm, other=0.0).to(tl.float16)
    k2 = kc_ptr.to(tl.pointer_type(tl.uint16))
    v2 = vc_ptr.to(tl.pointer_type(tl.uint16))
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc_e = tl.zeros([G_PAD, D // 2], tl.float32)
    acc_o = tl.zeros([G_PAD, D // 2], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    last_page = tl.maximum(seq_len - 1, 0) // S
    for t0 in range(0, seq_len, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        tmask = t < seq_len
        page = tl.load(bt_row + tl.minimum(t // S, last_page)).to(tl.int64)
        slot = (t % S).to(tl.int64)
        tok = page * stride_cn + kvh * stride_ch + slot * stride_cs
        sc = page * stride_sn + kvh * stride_sh + slot * stride_ss
        ke, ko = e4m3_pairs(tl.load(k2 + tok[None, :] + j[:, None]), False)
        s = tl.dot(qo, ko, tl.dot(qe, ke))
        s = s * (tl.load(ks_ptr + sc) * scale_log2)[None, :]
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vs = tl.where(tmask, tl.load(vs_ptr + sc), 0.0)
        pv = (p * (vs * 256.0)[None, :]).to(tl.float16)  # x256: small probabilities stay normal
        vv = tl.load(v2 + tok[:, None] + j[None, :])
        if V_PAIRS:
            ve, vo = e4m3_pairs(vv, False)
        else:
            ve = (vv & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
            vo = (vv >> 8).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        acc_e = acc_e * alpha[:, None] + tl.dot(pv, ve)
        acc_o = acc_o * alpha[:, None] + tl.dot(pv, vo)
        m_i = m_new
    den = (tl.where(l_i > 0, l_i, 1.0) * 256.0)[:, None]
    dst = out_ptr + b * stride_ob + (kvh * G + g)[:, None] * stride_oh + 2 * j[None, :]
    tl.store(dst, (acc_e / den).to(out_ptr.dtype.element_ty), mask=gm)
    tl.store(dst + 1, (acc_o / den).to(out_ptr.dtype.element_ty), mask=gm)


CONSTS = dict(G=4, G_PAD=16, S=16, D=128, BLOCK_N=128, V_PAIRS=True)


def gpu(args) -> dict:
    from kernel_bench import _paged

    from pdserve.kernels import reference
    from pdserve.kernels.decode_attention import decode_with_partitions, default_partition_size

    B, D, ctx = args.batch, 128, args.ctx
    q, kc, vc, ks, vs, bt, lens = wgmma_probe.inputs(B, ctx)
    res: dict = {"batch": B, "ctx": ctx, "gpu": torch.cuda.get_device_name()}
    chk = slice(0, 4)
    part = default_partition_size(B, kc.shape[2], bt.shape[1] * kc.shape[1], q.device)
    kb, vb, tb = _paged([ctx] * B)  # bf16, same shape
    # name -> (call over a table, its table, the KV bytes it reads); "ours": the served kernel
    # (pairs, 32-bit offsets), "old": the served kernel before 2026-12-07
    fp8_bytes, bf16_bytes = kc.numel() * 2 + ks.numel() * 8, kb.numel() * 2 * 2
    calls: dict = {}
    for name, kw in {"ours": {}, "old": dict(pairs=False, off32=False), "ours_off64": dict(off32=False),
                     "ours_s3": dict(num_stages=3)}.items():
        calls[name] = (lambda t, kw=kw: decode_with_partitions(q, kc, vc, t, lens, D ** -0.5, part, ks, vs, **kw),
                       bt, fp8_bytes)
    ki, vi = (torch.randint(-127, 128, kc.shape, dtype=torch.int8, device=kc.device) for _ in range(2))
    for name, kw in {"int8_pairs": {}, "int8_old": dict(pairs=False)}.items():  # int8 pairs: since 2026-12-07
        calls[name] = (lambda t, kw=kw: decode_with_partitions(q, ki, vi, t, lens, D ** -0.5, part, ks, vs, **kw),
                       bt, fp8_bytes)
    calls["bf16"] = (lambda t: decode_with_partitions(q, kb, vb, t, lens, D ** -0.5, part), tb, bf16_bytes)
    if args.probes:
        for name, (consts, warps, stages, reg) in {
            "probe": ({}, 4, 2, None), "probe_r128": ({}, 4, 2, 128),
            "probe_k_pairs_v_cvt": ({"V_PAIRS": False}, 4, 2, None),
        }.items():
            calls[name] = (lambda t, c=consts, w=warps, st=stages, r=reg: wgmma_probe.run(
                q, kc, vc, ks, vs, t, lens, c, w, st, r, kernel=_pair_kernel, base=CONSTS, unit=2), bt, fp8_bytes)
    refs = {"fp8": reference.paged_decode_attention(q[chk], kc, vc, bt[chk], lens[chk], D ** -0.5, ks, vs),
            "int8": reference.paged_decode_attention(q[chk], ki, vi, bt[chk], lens[chk], D ** -0.5, ks, vs),
            "bf16": reference.paged_decode_attention(q[chk], kb, vb, tb[chk], lens[chk], D ** -0.5)}
    shared = {id(t): t[:1].expand(B, -1).contiguous() for t in (bt, tb)}  # every row: sequence 0's pages (L2)
    ok = {}
    for name, (fn, table, _) in calls.items():
        try:
            out = fn(table)
            torch.cuda.synchronize()
            ok[name] = calls[name]
            want = refs[name.split("_")[0] if name.startswith(("int8", "bf16")) else "fp8"]
            res[name] = {"max_err": (out[chk].float() - want.float()).abs().max().item(),
                         "ref_max": want.float().abs().max().item()}
        except Exception as e:  # a variant that does not compile is a result too
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    times: dict[str, list[float]] = {n: [] for n in ok}
    floor: dict[str, list[float]] = {n: [] for n in ok}
    for _ in range(args.rounds):  # interleaved rounds
        for name, (fn, table, _) in ok.items():
            times[name].append(triton.testing.do_bench(lambda: fn(table), warmup=10, rep=60))
            floor[name].append(triton.testing.do_bench(lambda: fn(shared[id(table)]), warmup=10, rep=60))
    for name, (_, _, nbytes) in ok.items():
        ms, l2 = statistics.median(times[name]), statistics.median(floor[name])
        res[name].update(ms=ms, ms_rounds=times[name], GBps=nbytes / ms / 1e6, l2_ms=l2,
                         l2_ms_rounds=floor[name], over_ours=statistics.median(times["ours"]) / ms,
                         l2_over_ours=statistics.median(floor["ours"]) / l2)
    for name in calls:
        print(name, json.dumps({k: v for k, v in res[name].items() if not k.endswith("rounds")}), flush=True)
    return res


def main() -> None:
    wgmma_probe.cli(gpu, lambda: wgmma_probe.offline(
        {"pairs": {}, "K pairs, V by Triton's convert": {"c": {"V_PAIRS": False}},
         "pairs, 64-token tiles": {"c": {"BLOCK_N": 64}}, "pairs, 8 warps": {"w": 8}}, _pair_kernel, CONSTS))


if __name__ == "__main__":
    sys.exit(main())
