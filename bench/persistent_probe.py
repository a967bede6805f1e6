"""Would one persistent kernel per layer beat the batch-1 gemv chain? (diagnostic)

A batch-1 Llama-3.1-8B decode layer is four matrix-vector products (norm+qkv, o, norm+gate_up
with the SiLU-and-mul, down), each its own kernel. In a CUDA graph every kernel boundary still
costs a ramp (the first weight loads' latency with nothing in flight) and a tail (the last wave's
programs finishing unevenly): bench/results/bs1-chain-h200-2026-12-03-s8.json puts the chain at
0.81 of the copy bandwidth, the big gate_up at 0.96 and the small qkv at 0.75.

Here P programs stay resident and run the four phases back to back, each owning an equal,
contiguous slice of every weight (P divides the row counts: no wave tail), separated by a grid
barrier (an atomic counter). Before it waits at a barrier a program asks L2 for the start of its
next slice (the weights do not depend on the phase before), so HBM stays busy across the wait.
The attention is left out: o reads the q part of qkv, as bs1_probe's chain does.

`python bench/persistent_probe.py [--layers L] [--out FILE]` (CUDA) prints microseconds per
layer of the current chain (pdserve.kernels.gemv, one kernel per projection) and of the
persistent kernel, launched per layer or once for all layers, over knobs, with the max error
to the chain. Under TRITON_INTERPRET=1 `--check` runs small shapes phase by phase (the
interpreter runs programs one after another, so a barrier would never open) against torch.

Found (H100, 16 layers, bench/results/persistent-probe-h100-2026-12-06-s18a/-s18c.json): the chain
161-162 us per layer (0.89-0.90 of copy); the persistent kernel launched per layer at best 158.0
(0.913), launched once for all layers 172-174 (the in-kernel barriers cost more than launch
boundaries in a graph), and its phases as separate launches without barriers 158.2 (0.912). So
the barriers buy nothing. The equal-slice tiling ported into pdserve.kernels.gemv (5b56f55) made
whole batch-1 engine steps 27 % slower on the same H100 (bench/ab_decode.py, variant slices,
ab-decode-slices-h100-2026-12-06-s18d-*.json) and was dropped; why the engine and this chain
disagree was not looked into. No H200 ran it.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl

@triton.jit
def _prefetch_l2(ptrs):
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _grid_sync(ctr_ptr, err_ptr, target):
    """Every program arrives once; returns when `target` arrivals are counted (or sets err)."""
    tl.debug_barrier()
    tl.atomic_add(ctr_ptr, 1, sem="release", scope="gpu")
    cur = tl.load(ctr_ptr, volatile=True)
    spins = 0
    if tl.load(err_ptr, volatile=True) != 0:  # an earlier barrier gave up: do not wait again
        spins = 1 << 20
    while (cur < target) & (spins < (1 << 20)):  # then give up and flag it, never hang
        cur = tl.load(ctr_ptr, volatile=True)
        spins += 1
    if cur < target:
        tl.store(err_ptr, 1)
    tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _prefetch_slice(w_ptr, row0, n_rows_total, K, PF_LINES: tl.constexpr):
    """L2 prefetch of PF_LINES 128-byte lines from row row0 of a bf16 [., K] weight."""
    if PF_LINES > 0:
        line = tl.arange(0, PF_LINES)
        base = w_ptr.to(tl.pointer_type(tl.int8)) + row0.to(tl.int64) * K * 2
        end = (n_rows_total - row0).to(tl.int64) * K * 2
        off = tl.minimum(line.to(tl.int64) * 128, end - 1)
        _prefetch_l2(base + off)


@triton.jit
def _phase(
    x_ptr, r_ptr, sum_ptr, g_ptr, w_ptr, out_ptr, pid, K, n_out, eps,
    R: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr,
    GLU: tl.constexpr,
):
    """out[pid*R : (pid+1)*R] of W @ x (x = norm(x + r) * g when NORM; GLU: silu(gate) * up with
    the up rows n_out below the gate rows). Program 0 stores x + r to sum_ptr."""
    for c in tl.static_range(R // BN):
        o = pid * R + c * BN + tl.arange(0, BN)
        if GLU:
            rows_g = w_ptr + o.to(tl.int64)[:, None] * K
            rows_u = w_ptr + (o + n_out).to(tl.int64)[:, None] * K
            acc_u = tl.zeros([BN, BK], tl.float32)
        else:
            rows_g = w_ptr + o.to(tl.int64)[:, None] * K
        acc = tl.zeros([BN, BK], tl.float32)
        ss = tl.zeros([BK], tl.float32)
        for k0 in range(0, K, BK):
            k = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + k, cache_modifier=".cg")
            if HAS_RES:
                x = (x.to(tl.float32) + tl.load(r_ptr + k, cache_modifier=".cg").to(tl.float32)).to(x.dtype)
                if c == 0:
                    tl.store(sum_ptr + k, x, mask=(tl.zeros_like(k) + pid) == 0)
            xf = x.to(tl.float32)
            if NORM:
                ss += xf * xf
                xf *= tl.load(g_ptr + k).to(tl.float32)
            acc += tl.load(rows_g + k[None, :]).to(tl.float32) * xf[None, :]
            if GLU:
                acc_u += tl.load(rows_u + k[None, :]).to(tl.float32) * xf[None, :]
        y = tl.sum(acc, 1)
        if NORM:
            inv = tl.rsqrt(tl.sum(ss, 0) / K + eps)
            y *= inv
        if GLU:
            u = tl.sum(acc_u, 1)
            if NORM:
                u *= inv
            y = y / (1.0 + tl.exp(-y)) * u
        tl.store(out_ptr + o, y.to(out_ptr.dtype.element_ty))


@triton.jit
def _layers_kernel(
    h_ptr, res_a, res_b, g1_ptr, g2_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, qkv_ptr, mid_ptr, act_ptr,
    ctr_ptr, err_ptr, layer0, n_layers, eps,
    H: tl.constexpr, NQKV: tl.constexpr, I: tl.constexpr, P: tl.constexpr,
    R0: tl.constexpr, R1: tl.constexpr, R2: tl.constexpr, R3: tl.constexpr,
    BN0: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr, BN3: tl.constexpr, BK: tl.constexpr,
    PHASE_LO: tl.constexpr, PHASE_HI: tl.constexpr, SYNC: tl.constexpr, PF_LINES: tl.constexpr,
):
    """Layers [layer0, layer0 + n_layers), phases PHASE_LO..PHASE_HI of each: 0 norm+qkv,
    1 o (over qkv's first H values), 2 norm+gate_up+SiLU-and-mul, 3 down. h holds the layer's
    input and gets its output; the residual goes res_a -> res_b (phase 0) -> res_a (phase 2).
    SYNC: a grid barrier between phases (all P programs must be resident)."""
    pid = tl.program_id(0)
    n_sync = 0
    for li in range(n_layers):
        layer = (layer0 + li).to(tl.int64)
        wq = wqkv_ptr + layer * NQKV * H
        wo = wo_ptr + layer * H * H
        wg = wgu_ptr + layer * 2 * I * H
        wd = wd_ptr + layer * H * I
        g1 = g1_ptr + layer * H
        g2 = g2_ptr + layer * H
        if PHASE_LO <= 0 and PHASE_HI >= 0:
            _phase(h_ptr, res_a, res_b, g1, wq, qkv_ptr, pid, H, NQKV, eps, R0, BN0, BK, True, True, False)
            if SYNC:
                _prefetch_slice(wo, pid * R1, H, H, PF_LINES)
                n_sync += 1
                _grid_sync(ctr_ptr, err_ptr, n_sync * P)
        if PHASE_LO <= 1 and PHASE_HI >= 1:
            _phase(qkv_ptr, res_a, res_a, g1, wo, mid_ptr, pid, H, H, eps, R1, BN1, BK, False, False, False)
            if SYNC:
                _prefetch_slice(wg, pid * R2, I, H, PF_LINES // 2)
                _prefetch_slice(wg, I + pid * R2, 2 * I, H, PF_LINES // 2)
                n_sync += 1
                _grid_sync(ctr_ptr, err_ptr, n_sync * P)
        if PHASE_LO <= 2 and PHASE_HI >= 2:
            _phase(mid_ptr, res_b, res_a, g2, wg, act_ptr, pid, H, I, eps, R2, BN2, BK, True, True, True)
            if SYNC:
                _prefetch_slice(wd, pid * R3, H, I, PF_LINES)
                n_sync += 1
                _grid_sync(ctr_ptr, err_ptr, n_sync * P)
        if PHASE_LO <= 3 and PHASE_HI >= 3:
            _phase(act_ptr, res_a, res_a, g2, wd, h_ptr, pid, I, H, eps, R3, BN3, BK, False, False, False)
            if SYNC:
                if li + 1 < n_layers:
                    _prefetch_slice(wq + NQKV * H, pid * R0, NQKV, H, PF_LINES)
                    n_sync += 1
                    _grid_sync(ctr_ptr, err_ptr, n_sync * P)


class Layers:
    """Stacked weights of `layers` layers and the persistent kernel's buffers."""

    def __init__(self, layers: int, h: int, nqkv: int, inter: int, device: str, seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen, device=device) * 0.02).to(torch.bfloat16)

        self.h, self.nqkv, self.inter, self.layers = h, nqkv, inter, layers
        self.wqkv, self.wo = w(layers, nqkv, h), w(layers, h, h)
        self.wgu, self.wd = w(layers, 2 * inter, h), w(layers, h, inter)
        self.g1 = (1 + 0.1 * torch.randn(layers, h, generator=gen, device=device)).to(torch.bfloat16)
        self.g2 = (1 + 0.1 * torch.randn(layers, h, generator=gen, device=device)).to(torch.bfloat16)
        self.x0 = torch.randn(1, h, generator=gen, device=device).to(torch.bfloat16)
        self.r0 = torch.randn(1, h, generator=gen, device=device).to(torch.bfloat16)
        empty = lambda n: torch.empty(n, device=device, dtype=torch.bfloat16)  # noqa: E731
        self.hbuf, self.res_a, self.res_b = empty(h), empty(h), empty(h)
        self.qkv, self.mid, self.act = empty(nqkv), empty(h), empty(inter)
        self.ctr = torch.zeros(1, device=device, dtype=torch.int32)
        self.err = torch.zeros(1, device=device, dtype=torch.int32)

    def run(self, p: int, bn: tuple[int, int, int, int], bk: int, *, sync: bool, per_layer: bool,
            pf_lines: int = 0, num_warps: int = 4, maxnreg: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """All layers from (x0, r0); returns (h, residual) after the last one."""
        rows = (self.nqkv // p, self.h // p, self.inter // p, self.h // p)
        for r, b, n in zip(rows, bn, (self.nqkv, self.h, self.inter, self.h)):
            assert r * p == n and r % b == 0, f"P={p} must split {n} rows into multiples of {b}"
        self.hbuf.copy_(self.x0[0])
        self.res_a.copy_(self.r0[0])
        phases = [(0, 3)] if sync else [(i, i) for i in range(4)]
        spans = [(l, 1) for l in range(self.layers)] if per_layer or not sync else [(0, self.layers)]
        for layer0, n in spans:
            for lo, hi in phases:
                if sync:
                    self.ctr.zero_()
                self.compiled = _layers_kernel[(p,)](
                    self.hbuf, self.res_a, self.res_b, self.g1, self.g2, self.wqkv, self.wo, self.wgu, self.wd,
                    self.qkv, self.mid, self.act, self.ctr, self.err, layer0, n, 1e-5,
                    H=self.h, NQKV=self.nqkv, I=self.inter, P=p, R0=rows[0], R1=rows[1], R2=rows[2], R3=rows[3],
                    BN0=bn[0], BN1=bn[1], BN2=bn[2], BN3=bn[3], BK=bk, PHASE_LO=lo, PHASE_HI=hi, SYNC=sync,
                    PF_LINES=pf_lines, num_warps=num_warps, **({"maxnreg": maxnreg} if maxnreg else {}),
                )
        return self.hbuf.view(1, -1), self.res_a.view(1, -1)

    def reference(self, use_gemv: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The same layers through pdserve.kernels.gemv (use_gemv, CUDA) or torch in float32."""
        from pdserve.kernels.gemv import gemv, gemv_tiles, norm_gemv
        from pdserve.kernels.reference import rms_norm, silu_and_mul
        h, r = self.x0, self.r0
        for l in range(self.layers):
            if use_gemv:
                qkv, r = norm_gemv(h, self.g1[l], 1e-5, r, self.wqkv[l], **_tiles(gemv_tiles, self.wqkv[l]))
                mid = gemv(qkv[:, :self.h], self.wo[l], **_tiles(gemv_tiles, self.wo[l]))
                act, r = norm_gemv(mid, self.g2[l], 1e-5, r, self.wgu[l], glu=True, **_tiles(gemv_tiles, self.wgu[l]))
                h = gemv(act, self.wd[l], **_tiles(gemv_tiles, self.wd[l]))
            else:
                x, r = rms_norm(h, self.g1[l], 1e-5, r)
                qkv = (x.float() @ self.wqkv[l].float().T).to(h.dtype)
                mid = (qkv[:, :self.h].float() @ self.wo[l].float().T).to(h.dtype)
                x, r = rms_norm(mid, self.g2[l], 1e-5, r)
                act = silu_and_mul((x.float() @ self.wgu[l].float().T).to(h.dtype))
                h = (act.float() @ self.wd[l].float().T).to(h.dtype)
        return h, r


def _tiles(tiles, w: torch.Tensor) -> dict:
    bn, bk, warps = tiles(*w.shape)
    return {"block_n": bn, "block_k": bk, "num_warps": warps}


def check() -> None:
    """Small shapes, phase by phase (no barriers), against torch (CPU, TRITON_INTERPRET=1)."""
    m = Layers(2, 256, 384, 896, "cpu")
    h, r = m.run(32, (4, 8, 4, 8), 128, sync=False, per_layer=True)
    rh, rr = m.reference(use_gemv=False)
    eh, er = (h.float() - rh.float()).abs().max().item(), (r.float() - rr.float()).abs().max().item()
    scale = rh.float().abs().max().item()
    print(f"max err h {eh:.3e} (|h| max {scale:.3e}), residual {er:.3e}")
    assert eh <= 0.02 * scale and er <= 0.02 * rr.float().abs().max().item(), "persistent chain != reference"


def bench(layers: int) -> dict:
    from triton.testing import do_bench, do_bench_cudagraph
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    copy = 2 * a.numel() / (do_bench(lambda: b.copy_(a), rep=200, return_mode="median") * 1e3) / 1e3
    m = Layers(layers, 4096, 6144, 14336, "cuda")
    gb = (m.wqkv[0].numel() + m.wo[0].numel() + m.wgu[0].numel() + m.wd[0].numel()) * 2 / 1e3
    ref_h, ref_r = m.reference(use_gemv=True)
    res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "copy_GBps": copy,
           "layers": layers, "variants": {}}
    print(f"copy {copy:.0f} GB/s; {gb / 1e3:.1f} MB of weights per layer", flush=True)

    def record(label: str, fn, check_out: bool) -> None:
        try:
            m.err.zero_()
            out = fn()
            # relative to the reference's largest value (16 layers of bf16 roundings drift apart)
            err = ((out[0].float() - ref_h.float()).abs().max() / ref_h.float().abs().max()).item() if check_out else 0.0
            torch.cuda.synchronize()
            if m.err.item():
                raise RuntimeError("a barrier timed out (programs not all resident?)")
            t = do_bench_cudagraph(fn, rep=100) * 1e3 / layers
            regs = getattr(getattr(m, "compiled", None), "n_regs", None) if check_out else None
            res["variants"][label] = {"us_per_layer": t, "ratio_to_copy": gb / t / copy, "max_err": err, "regs": regs}
            print(f"{label:60s} {t:8.2f} us/layer {gb / t / copy:.3f} of copy rel err {err:.2e} regs {regs}", flush=True)
        except Exception as e:  # noqa: BLE001
            res["variants"][label] = {"failed": f"{type(e).__name__}: {str(e)[:200]}"}
            print(f"{label}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)

    record("chain (gemv kernels)", lambda: m.reference(use_gemv=True), False)
    grid = [
        # (P, BN per phase, BK, warps, pf_lines, maxnreg); H100 (a1feeb8): P=512 BK=1024 was best per layer
        (512, (4, 8, 4, 8), 1024, 4, 128, None), (512, (4, 8, 4, 8), 1024, 4, 128, 128),
        (512, (4, 8, 4, 8), 2048, 4, 128, 128), (512, (4, 8, 4, 8), 1024, 4, 0, 128),
        (256, (8, 16, 8, 16), 1024, 8, 256, 128), (256, (8, 8, 4, 8), 2048, 8, 256, 128),
    ]
    for p, bn, bk, warps, pf, maxnreg in grid:
        kw = dict(bk=bk, num_warps=warps, pf_lines=pf, maxnreg=maxnreg)
        tag = f"P={p} bn={bn} bk={bk} warps={warps} pf={pf} maxnreg={maxnreg}"
        record(f"one launch, {tag}", lambda: m.run(p, bn, sync=True, per_layer=False, **kw), True)  # noqa: B023
        record(f"per layer,  {tag}", lambda: m.run(p, bn, sync=True, per_layer=True, **kw), True)  # noqa: B023
    kw = dict(bk=1024, num_warps=4, pf_lines=0, maxnreg=None)
    record("per phase (no barrier), P=512 bk=1024", lambda: m.run(512, (4, 8, 4, 8), sync=False, per_layer=True, **kw), True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--out")
    ap.add_argument("--check", action="store_true", help="small shapes under TRITON_INTERPRET=1")
    a = ap.parse_args()
    if a.check:
        check()
        return
    res = bench(a.layers)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
