"""Where a decode step's GPU time goes: torch.profiler over CUDA-graph replays of decode steps.

    python bench/profile_decode.py --out FILE [--model llama-3.1-8b] [--batches 1,256] [--ctx 128,1024]

Random weights of the model's real shape. For each (batch, context) the step is run once (which
captures or reuses the graph), then `--steps` steps are profiled; kernel time is summed by kernel
name and divided by the steps. Prints a table per case and writes the JSON: per case the step
time, the summed kernel time and the top kernels with their microseconds per step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner

from engine import BS, CONFIGS, decode_step, timed  # bench/ is on sys.path when run as a script


def kernel_table(prof: profile, steps: int) -> list[dict]:
    """[(name, us per step, calls per step)] of device kernels, largest first."""
    rows = []
    for ev in prof.key_averages():
        us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        if us <= 0 or ev.key.startswith("cuda"):  # runtime API calls, not kernels
            continue
        rows.append({"kernel": ev.key[:120], "us_per_step": us / steps, "calls_per_step": ev.count / steps})
    return sorted(rows, key=lambda r: -r["us_per_step"])


def profile_case(runner: ModelRunner, spec: ModelSpec, batch: int, ctx: int, steps: int) -> dict:
    step = decode_step(batch, ctx, spec.vocab_size)
    t = timed(lambda: runner.execute(step), iters=10)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.execute(step)
        torch.cuda.synchronize()
    rows = kernel_table(prof, steps)
    total = sum(r["us_per_step"] for r in rows)
    return {"batch": batch, "ctx": ctx, "step_ms": t * 1e3, "kernel_ms_per_step": total / 1e3,
            "launches_per_step": sum(r["calls_per_step"] for r in rows), "top": rows[:25]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--batches", default="1,256")
    p.add_argument("--ctx", default="128,1024", help="one context per batch size, same order")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    a = p.parse_args()
    spec = ModelSpec.from_config_dict(json.loads((CONFIGS / f"{a.model}.json").read_text()))
    batches = [int(x) for x in a.batches.split(",")]
    ctxs = [int(x) for x in a.ctx.split(",")]
    if len(ctxs) != len(batches):
        p.error("--ctx needs one context per batch size")
    blocks = max(b * (c // BS + 1) for b, c in zip(batches, ctxs)) + 64
    runner = ModelRunner(spec, None, device="cuda", dtype=torch.bfloat16, num_blocks=blocks, block_size=BS,
                         load_format="dummy", max_model_len=max(ctxs) + 64, max_num_seqs=max(batches),
                         enforce_eager=a.eager)
    runner.kv_pool.normal_()
    cases = []
    for b, c in zip(batches, ctxs):
        case = profile_case(runner, spec, b, c, a.steps)
        cases.append(case)
        print(f"== {a.model} batch {b} ctx {c}: step {case['step_ms']:.3f} ms, kernels "
              f"{case['kernel_ms_per_step']:.3f} ms, {case['launches_per_step']:.0f} launches/step")
        for r in case["top"][:18]:
            print(f"  {r['us_per_step']:9.1f} us  x{r['calls_per_step']:5.0f}  {r['kernel'][:90]}")
    Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "model": a.model,
                                       "graphs": not a.eager, "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
