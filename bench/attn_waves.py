"""bf16 paged decode attention at the engine's batch-256 shape: how far from the read ceiling,
and which launch shape gets closest (diagnostic, CUDA only).

    python bench/attn_waves.py --out FILE.json

At batch 256 x 1k context the 2,048 (sequence, KV head) programs of the default launch fill an
H200's 132 SMs in about 5.2 waves of 3, so the last wave runs a sixth full. This times the real
kernel (decode_with_partitions) over a pool of the Llama-3.1-8B head shape, block tables as wide
as a 4k model length (as bench/engine.py builds them), for split-K partitions, tiles, warps and
stages, beside two ceilings measured in the same run: a device copy (bytes read + written) and a
Triton kernel that only reads (the bytes of a 4 GiB tensor summed per program).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernel_bench import HQ, HK, D, _ms, _paged, copy_bandwidth_gbs, quant_paged
from pdserve.bench.provenance import source_commit
from pdserve.kernels.decode_attention import decode_with_partitions, default_partition_size

WIDTH = 4096  # tokens of block table, as bench/engine.py builds them for a 4k model length


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS):
        offs = (pid * ITERS + i).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def read_bandwidth_gbs(nbytes: int = 4 << 30) -> dict:
    """Bytes read per second by a plain streaming kernel, best of a few launch shapes."""
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    best = {}
    for block, iters, warps in itertools.product((2048, 4096, 8192), (4, 16), (4, 8)):
        programs = triton.cdiv(x.numel(), block * iters)
        out = torch.empty(programs, dtype=torch.float32, device="cuda")
        ms = _ms(lambda: _read_kernel[(programs,)](x, out, x.numel(), BLOCK=block, ITERS=iters, num_warps=warps))
        gbs = nbytes / (ms * 1e-3) / 1e9
        if gbs > best.get("gb_s", 0):
            best = {"gb_s": gbs, "block": block, "iters": iters, "warps": warps}
    return best


def pool(seqs: int, context: int) -> tuple[torch.Tensor, ...]:
    """q, k_cache, v_cache, block tables WIDTH tokens wide with shuffled pages, seq_lens."""
    kc, vc, tables = _paged([context] * seqs, WIDTH)
    return _query(seqs), kc, vc, tables, _lens(seqs, context)


def fp8_pool(seqs: int, context: int) -> tuple[torch.Tensor, ...]:
    """pool() over an fp8 e4m3 cache with per-token scales (the kvquant layout), then the scales."""
    kc, vc, ks, vs, tables = quant_paged(seqs, context, "fp8_e4m3", WIDTH)
    return _query(seqs), kc, vc, tables, _lens(seqs, context), ks, vs


def _query(seqs: int) -> torch.Tensor:
    return torch.randn(seqs, HQ, D, dtype=torch.bfloat16, device="cuda")


def _lens(seqs: int, context: int) -> torch.Tensor:
    return torch.full((seqs,), context, dtype=torch.int32, device="cuda")


def sweep(seqs: int, context: int, read_gbs: float) -> dict:
    q, kc, vc, tables, lens = pool(seqs, context)
    kv_bytes = seqs * context * HK * D * 2 * 2
    auto = default_partition_size(seqs, HK, WIDTH, q.device)
    rows = []
    for part, block_n, warps, stages in itertools.product((4096, 2048, 1024, 512, 256), (32, 64, 128), (4, 8),
                                                          (2, 3, 4)):
        if part < block_n:
            continue
        try:
            ms = _ms(lambda: decode_with_partitions(q, kc, vc, tables, lens, D**-0.5, part, block_n=block_n,
                                                    num_warps=warps, num_stages=stages))
        except Exception as e:  # out of shared memory for a tile/stage mix: recorded, not hidden
            rows.append({"part": part, "block_n": block_n, "warps": warps, "stages": stages, "error": repr(e)[:200]})
            continue
        gbs = kv_bytes / (ms * 1e-3) / 1e9
        rows.append({"part": part, "block_n": block_n, "warps": warps, "stages": stages, "ms": ms, "gb_s": gbs,
                     "frac_of_read": gbs / read_gbs})
    ok = [r for r in rows if "ms" in r]
    default = next(r for r in ok if (r["part"], r["block_n"], r["warps"], r["stages"]) == (auto, 64, 4, 2))
    best = min(ok, key=lambda r: r["ms"])
    return {"seqs": seqs, "context": context, "auto_part": auto, "default": default, "best": best,
            "best_over_default": default["ms"] / best["ms"], "rows": rows}


def part_sweep(kv: str) -> list[dict]:
    """Every partition size at default tiles, batch 1-256 x 1k/4k context: the best one against
    the default heuristic's pick. Launched eagerly, so rows under ~0.04 ms time the host's
    launch of the two kernels (see floor()), not the GPU."""
    rows = []
    for seqs, context in itertools.product((1, 4, 8, 16, 32, 64, 128, 256), (1024, 4096)):
        q, kc, vc, tables, lens, *scales = fp8_pool(seqs, context) if kv == "fp8" else pool(seqs, context)
        auto = default_partition_size(seqs, HK, WIDTH, q.device)
        times = {part: _ms(lambda p=part: decode_with_partitions(q, kc, vc, tables, lens, D**-0.5, p, *scales))
                 for part in (4096, 2048, 1024, 512, 256, 128)}
        best = min(times, key=times.get)
        rows.append({"kv": kv, "seqs": seqs, "context": context, "auto_part": auto, "best_part": best,
                     "ms_by_part": times, "auto_over_best": times[auto] / times[best]})
        print(f"{kv} {seqs}x{context}: auto {auto} {times[auto]:.4f} ms, best {best} {times[best]:.4f} ms "
              f"(x{times[auto] / times[best]:.3f}) " + " ".join(f"{p}:{t:.4f}" for p, t in times.items()), flush=True)
        del q, kc, vc, tables, lens, scales
    return rows


def floor() -> list[dict]:
    """Kernel by kernel (torch profiler, device time) at batch 1 x 1k, split and unsplit, bf16 and
    fp8: where a small split launch's fixed cost goes."""
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for kv, part in itertools.product(("bf16", "fp8"), (4096, 256)):
        q, kc, vc, tables, lens, *scales = fp8_pool(1, 1024) if kv == "fp8" else pool(1, 1024)
        fn = lambda: decode_with_partitions(q, kc, vc, tables, lens, D**-0.5, part, *scales)  # noqa: E731
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
        kernels = {e.key: e.device_time_total / e.count for e in prof.key_averages() if e.device_time_total > 0}
        rows.append({"kv": kv, "part": part, "us_per_call": kernels, "bench_ms": _ms(fn)})
        print(kv, part, {k[:40]: round(v, 2) for k, v in kernels.items()}, f"do_bench {rows[-1]['bench_ms']:.4f} ms",
              flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cases", default="256x1024,128x1024,256x4096,64x4096")
    p.add_argument("--parts", action="store_true", help="only the partition sweep (bf16 and fp8)")
    p.add_argument("--floor", action="store_true", help="only the batch-1 kernel-by-kernel profile")
    a = p.parse_args()
    if a.floor:
        Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "floor": floor()}, indent=1))
        return
    if a.parts:
        res = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
               "commit": source_commit() or "unknown", "parts": part_sweep("bf16") + part_sweep("fp8")}
        Path(a.out).write_text(json.dumps(res, indent=1))
        return
    res = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "commit": source_commit() or "unknown", "copy_GBps": copy_bandwidth_gbs()}
    res["read"] = read_bandwidth_gbs()
    res["read_over_copy"] = res["read"]["gb_s"] / res["copy_GBps"]
    print(f"copy {res['copy_GBps']:.0f} GB/s, read {res['read']}", flush=True)
    res["cases"] = []
    for case in a.cases.split(","):
        seqs, context = map(int, case.split("x"))
        c = sweep(seqs, context, res["read"]["gb_s"])
        res["cases"].append(c)
        d, b = c["default"], c["best"]
        print(f"{case}: default part={d['part']} {d['ms']:.3f} ms {d['gb_s']:.0f} GB/s ({d['frac_of_read']:.3f} of read)"
              f" | best part={b['part']} block_n={b['block_n']} warps={b['warps']} stages={b['stages']}"
              f" {b['ms']:.3f} ms {b['gb_s']:.0f} GB/s ({b['frac_of_read']:.3f}) x{c['best_over_default']:.3f}",
              flush=True)
        top = sorted((r for r in c["rows"] if "ms" in r), key=lambda r: r["ms"])[:6]
        for r in top:
            print("   ", {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}, flush=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
