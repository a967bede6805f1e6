"""Routed-experts op variants on one CUDA GPU, each captured in a CUDA graph (device time only):
`python bench/moe_probe.py --out FILE`. Qwen3-30B-A3B's expert shapes (128 experts, 8 per token,
hidden 2048, expert width 768), bf16. For each token count: the per-pair gemv path and expert
tiles with several tile shapes; the bytes of the distinct chosen experts over the time (GB/s)
and 2*T*k*3*H*I FLOP over the time (TFLOP/s). Then the kernels of one eager batch-1 decode step
of a 4-layer model by device time (torch.profiler).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from engine import CONFIGS, decode_step

from pdserve.kernels import reference
from pdserve.kernels.fused_moe import _gemv, expert_tiles, expert_tiles_torch, experts_by_pair, experts_by_tile
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner

E, K, H, I = 128, 8, 2048, 768
TILES = {"bm16_bn64_bk128_s3": (16, 64, 128, 3), "bm16_bn128_bk64_s4": (16, 128, 64, 4),
         "bm32_bn64_bk64_s4": (32, 64, 64, 4), "bm64_bn128_bk64_s3": (64, 128, 64, 3)}


def graph_us(fn, reps: int = 30) -> float:
    """Median device microseconds of one replay of fn captured in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def op_rows() -> dict:
    gate_up = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16) * 0.02
    down = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16) * 0.02
    per_expert = gate_up[0].nbytes + down[0].nbytes
    out = {}
    for t in (1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096):
        x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
        weights, ids = reference.moe_route(torch.randn(t, E, device="cuda"), K, True)
        want = reference.moe_experts(x, weights, ids, gate_up, down).float()
        nbytes = len(set(ids.flatten().tolist())) * per_expert
        flops = 2 * t * K * 3 * H * I
        row = {}
        variants = {name: (lambda c=c: experts_by_tile(x, weights, ids, gate_up, down, *c)) for name, c in TILES.items()}
        if t * K <= 512:
            variants["gemv"] = lambda: experts_by_pair(x, weights, ids, gate_up, down)
        variants["expert_tiles_torch_only"] = lambda: expert_tiles_torch(ids, E, 16)
        if t * K <= 4096:  # the Triton grouping, which must be the torch one, row for row
            variants["expert_tiles_triton_only"] = lambda: expert_tiles(ids, E, 16, max_kernel_pairs=t * K)
            assert all(torch.equal(a, b) for a, b in zip(variants["expert_tiles_triton_only"](),
                                                         expert_tiles_torch(ids, E, 16)))
        for name, fn in variants.items():
            err = 0.0 if name.startswith("expert_tiles") else ((fn().float() - want).norm() / want.norm()).item()
            us = graph_us(fn)
            row[name] = {"us": us, "GBps": nbytes / us / 1e3, "TFLOPs": flops / us / 1e6, "rel_err": err}
        out[str(t)] = row
        best = min((v["us"], k) for k, v in row.items() if not k.startswith("expert_tiles"))
        print(t, {k: round(v["us"], 1) for k, v in row.items()}, "best", best[1],
              "max_err", max(v["rel_err"] for v in row.values()), flush=True)
    return out


def gemv_sweep() -> dict:
    """The gemv path's tile knobs at 1, 4 and 8 tokens: gate_up and down launches apart."""
    gate_up = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16) * 0.02
    down = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16) * 0.02
    out: dict = {}
    for t in (1, 4, 8):
        x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
        weights, ids = reference.moe_route(torch.randn(t, E, device="cuda"), K, True)
        flat, scale = ids.reshape(-1), weights.reshape(-1)
        act = _gemv(x, gate_up, flat, scale, K, True)
        want = reference.moe_experts(x, weights, ids, gate_up, down).float()
        row = {}
        for bn in (8, 16, 32):
            for warps in (2, 4):
                row[f"gate_up_bn{bn}_w{warps}"] = graph_us(
                    lambda bn=bn, warps=warps: _gemv(x, gate_up, flat, scale, K, True, bn, warps))
        for bn in (2, 4, 8, 16):
            for warps in (1, 2, 4):
                fn = lambda bn=bn, warps=warps: _gemv(act, down, flat, scale, K, False, bn, warps)  # noqa: E731
                err = ((fn().float() - want).norm() / want.norm()).item()
                row[f"down_bn{bn}_w{warps}"] = graph_us(fn)
                assert err < 2e-2, (t, bn, warps, err)
        out[str(t)] = row
        best = {kind: min((v, k) for k, v in row.items() if k.startswith(kind)) for kind in ("gate_up", "down")}
        print("gemv sweep", t, {k: round(v, 1) for k, v in row.items()}, "best", best, flush=True)
    return out


def step_kernels(layers: int = 4) -> list:
    cfg = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text()) | {"num_hidden_layers": layers}
    spec = ModelSpec.from_config_dict(cfg)
    runner = ModelRunner(spec, None, device="cuda", dtype=torch.bfloat16, num_blocks=64, block_size=16,
                         load_format="dummy", max_model_len=1024, enforce_eager=True)
    step = decode_step(1, 128, spec.vocab_size)
    for _ in range(3):
        runner.execute(step)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            runner.execute(step)
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 5, e.count // 5) for e in prof.key_averages()]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    print(f"bs1 step ({layers} layers): {total:.0f} us of kernels", flush=True)
    for name, us, n in rows[:14]:
        print(f"  {us:8.1f} us  x{n:3d}  {name[:90]}")
    return [{"kernel": n, "us_per_step": us, "launches": c} for n, us, c in rows[:20]]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sweep", action="store_true", help="the gemv path's knobs only")
    a = p.parse_args()
    torch.manual_seed(0)
    res = {"gpu": torch.cuda.get_device_name(), "shape": {"experts": E, "top_k": K, "hidden": H, "inter": I}}
    if a.sweep:
        res["gemv_sweep"] = gemv_sweep()
        Path(a.out).write_text(json.dumps(res, indent=1))
        return
    res["op"] = op_rows()
    Path(a.out).write_text(json.dumps(res, indent=1))
    res["bs1_step_kernels"] = step_kernels()
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
