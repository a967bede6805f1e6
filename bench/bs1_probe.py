"""Where batch-1 decode loses to the roofline (diagnostic, CUDA only).

`python bench/bs1_probe.py [--out FILE]` times, inside CUDA graphs (triton.testing.do_bench_cudagraph),
the matrix-vector products of one Llama-3.1-8B decode step through F.linear (cuBLAS) and through
pdserve.kernels.gemv over a sweep of its tiles, as GB/s of weight read over a device copy measured in
the same run; and the paged decode attention at one sequence of 128 tokens as the block-table width
(which sets the split-K partition count in a CUDA graph) grows. `--chain` times only the four
projections of 8 layers in one graph (gaps included), the RMSNorms as separate kernels or fused into
the gemv after them, and sweeps the fused kernel's tiles.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench, do_bench_cudagraph

from pdserve.kernels.decode_attention import paged_decode_attention
from pdserve.kernels.gemv import gemv, gemv_tiles, norm_gemv
from pdserve.kernels.rms_norm import rms_norm
from pdserve.kernels.silu_and_mul import silu_and_mul

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}


def us(fn) -> float:
    return do_bench_cudagraph(fn, rep=100) * 1e3


def copy_gbps() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / (do_bench(lambda: b.copy_(a), rep=200, return_mode="median") * 1e3) / 1e3


def linears(copy: float) -> dict:
    out = {}
    for name, (n, k) in SHAPES.items():
        # copies enough to overflow the 50 MB L2, each read once per timed call, as in a step
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
              for _ in range(max(1, -(-256 * 2**20 // (n * k * 2))))]
        w = ws[0]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, w)
        gb = n * k * 2 / 1e3
        row = {"cublas_us": us(lambda: [F.linear(x, wi) for wi in ws]) / len(ws), "copies": len(ws)}
        row["cublas_ratio"] = gb / row["cublas_us"] / copy
        best = None
        for bn in (4, 8, 16, 32):
            for bk in (256, 512, 1024):
                for warps in (4, 8):
                    if bn * bk > 16384:
                        continue
                    err = (gemv(x, w, block_n=bn, block_k=bk, num_warps=warps).float() - ref.float()).abs().max().item()
                    t = us(lambda: [gemv(x, wi, block_n=bn, block_k=bk, num_warps=warps) for wi in ws]) / len(ws)  # noqa: B023
                    if best is None or t < best[0]:
                        best = (t, bn, bk, warps, err)
        row |= {"gemv_us": best[0], "gemv_ratio": gb / best[0] / copy, "gemv_block_n": best[1],
                "gemv_block_k": best[2], "gemv_warps": best[3], "gemv_max_err": best[4]}
        print(name, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
              flush=True)
        out[name] = row
        ws.clear()
    return out


def attention() -> dict:
    out = {}
    pool = torch.randn(2, 4096, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([128], dtype=torch.int32, device="cuda")
    for width in (8, 64, 256, 1024, 4096):
        table = torch.arange(width, dtype=torch.int32, device="cuda").view(1, width)
        t = us(lambda: paged_decode_attention(q, pool[0], pool[1], table, lens, 128 ** -0.5))
        out[str(width)] = t
        print(f"decode attention 1 x 128 tokens, table width {width}: {t:.2f} us", flush=True)
    return out


def fused_tiles(copy: float) -> dict:
    """Per norm-fused projection (qkv, gate_up): the best tiles of norm_gemv and of the plain
    gemv over the same sweep, in microseconds (L2-cold weights)."""
    out = {}
    for name in ("qkv", "gate_up"):
        n, k = SHAPES[name]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
              for _ in range(max(1, -(-256 * 2**20 // (n * k * 2))))]
        x, r = (torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        g = torch.ones(k, device="cuda", dtype=torch.bfloat16)
        row: dict = {}
        for label in ("plain", "norm"):
            best = None
            for bn in (8, 16, 32):
                for bk in (256, 512, 1024):
                    for warps in (4, 8):
                        if bn * bk > 16384:
                            continue
                        kw = {"block_n": bn, "block_k": bk, "num_warps": warps}
                        if label == "plain":
                            fn = lambda wi: gemv(x, wi, **kw)  # noqa: E731, B023
                        else:
                            fn = lambda wi: norm_gemv(x, g, 1e-5, r, wi, **kw)  # noqa: E731, B023
                        t = us(lambda: [fn(wi) for wi in ws]) / len(ws)  # noqa: B023
                        if best is None or t < best[0]:
                            best = (t, bn, bk, warps)
            row[label] = {"us": best[0], "ratio": n * k * 2 / 1e3 / best[0] / copy, "tiles": list(best[1:])}
        print(name, json.dumps(row), flush=True)
        out[f"norm+{name}"] = row
    return out


def chain(copy: float, layers: int = 8) -> dict:
    """Microseconds per layer of qkv, o, gate_up, down (+ 2 RMSNorms, 1 SiLU) over `layers`
    layers of distinct weights in one CUDA graph, the norms separate or fused into the gemv;
    and the weight bytes' ratio to the copy bandwidth. (bench/results/bs1-chain-h200-2026-12-03-s8.json
    came from commit 98a4f89, which also timed a SiLU fusion and programmatic dependent launch.)"""
    def w(name: str) -> torch.Tensor:
        return torch.randn(*SHAPES[name], device="cuda", dtype=torch.bfloat16) * 0.02
    ws = [{name: w(name) for name in ("qkv", "o", "gate_up", "down")} for _ in range(layers)]
    g = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)

    def lin(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        bn, bk, warps = gemv_tiles(*wt.shape)
        return gemv(x, wt, block_n=bn, block_k=bk, num_warps=warps)

    def norm_lin(r: torch.Tensor, wt: torch.Tensor, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if not fused:
            x, r = rms_norm(h, g, 1e-5, r)
            return lin(x, wt), r
        bn, bk, warps = gemv_tiles(*wt.shape)
        return norm_gemv(h, g, 1e-5, r, wt, block_n=bn, block_k=bk, num_warps=warps)

    def layers_of(fused: bool) -> None:
        r = h
        for lw in ws:
            qkv, r = norm_lin(r, lw["qkv"], fused)
            lin(qkv[:, :4096].contiguous(), lw["o"])
            gu, r = norm_lin(r, lw["gate_up"], fused)
            lin(silu_and_mul(gu), lw["down"])

    gb = sum(t.numel() * 2 for t in ws[0].values()) / 1e3
    out = {}
    for key, fused in (("separate", False), ("fused", True)):
        t = us(lambda: layers_of(fused)) / layers  # noqa: B023
        out[key] = {"us_per_layer": t, "ratio_to_copy": gb / t / copy}
        print(f"chain {key:14s} {t:8.2f} us per layer  {gb / t / copy:.3f} of copy", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--chain", action="store_true", help="only the layer chain (fusions, PDL)")
    a = p.parse_args()
    copy = copy_gbps()
    print(f"copy {copy:.0f} GB/s", flush=True)
    res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "copy_GBps": copy}
    if a.chain:
        res["chain"] = chain(copy)
        res["fused_tiles"] = fused_tiles(copy)
    else:
        res |= {"linear": linears(copy), "attention_us_by_table_width": attention(), "chain": chain(copy)}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
