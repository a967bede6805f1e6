"""Sampling cost per decode step on one CUDA GPU: the sampler's two top-k/top-p paths, the
sort-free one (Triton nucleus_threshold) and the sorted one, at each batch size; the sampler
takes the first from TRITON_NUCLEUS_MIN_ROWS rows. Top-p rows without top-k also time the
one-kernel draw (kernels/sample.py, the sampler's default for them since 2026-12-05:
`sample_top_p_kernel`), and temperature-only rows, seeded or not, the split-row draw
(kernels/sample_temperature.py, their default since 2026-12-06: `sample_temperature_kernel`);
the other figures are taken with the kernels off.

    python bench/sampler.py --out bench/results/sampler-<gpu>-<date>.json

Logits [B, 128256] (Llama-3's vocab) in bf16 as the model gives them, B = 1 ... 256;
temperature 1 and top-p 0.9 (the engine loop's sampled figures), top-k 50 + top-p 0.9, and
temperature 1 alone (the OpenAI default), unseeded and seeded.
Times sample_on_device whole (upcast, probabilities, the exponential race) and the threshold
alone, with its sorted reference twin; the floor is one read of the fp32 logits at the copy
bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from pdserve.bench.provenance import source_commit
from pdserve.core.sampling import SamplingParams
from pdserve.kernels import reference
from pdserve.kernels.nucleus import nucleus_threshold
from pdserve.runtime import sampler
from pdserve.runtime.sampler import sample_on_device, to_device

sys.path.insert(0, str(Path(__file__).parent))
from engine import copy_bandwidth, timed  # noqa: E402

VOCAB = 128256


KNOBS = [(nc, block, warps) for nc in (2, 4, 8) for block, warps in ((1024, 8), (2048, 8), (2048, 16), (4096, 16))]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--knobs", action="store_true", help="also sweep nucleus_threshold's tuning knobs")
    p.add_argument("--temperature-knobs", action="store_true",
                   help="only sweep sample_temperature's knobs (the kernels alone, 1-256 rows)")
    a = p.parse_args()
    if a.temperature_knobs:
        Path(a.out).write_text(json.dumps(temperature_knobs(), indent=1))
        return
    gbps = copy_bandwidth()
    res: dict = {"gpu": torch.cuda.get_device_name(), "commit": source_commit(), "copy_GBps": gbps,
                 "vocab": VOCAB, "triton_min_rows": sampler.TRITON_NUCLEUS_MIN_ROWS, "ms": {}}
    settings = {"top_p": SamplingParams(temperature=1.0, top_p=0.9),
                "top_k_top_p": SamplingParams(temperature=1.0, top_k=50, top_p=0.9),
                "temperature": SamplingParams(temperature=1.0),
                "temperature_seeded": SamplingParams(temperature=1.0, seed=7)}
    default_rows = sampler.TRITON_NUCLEUS_MIN_ROWS
    for b in (1, 8, 16, 32, 64, 128, 256):
        logits = (torch.randn(b, VOCAB, device="cuda") * 4).bfloat16()
        row: dict = {"floor_fp32_read": b * VOCAB * 4 / (gbps * 1e9) * 1e3}
        x = logits.float()
        for name, sp in settings.items():
            params, pos = [sp] * b, list(range(b))
            sampler.KERNEL_SAMPLING = False
            for impl, min_rows in (("sorted", b + 1), ("threshold", 1)):
                sampler.TRITON_NUCLEUS_MIN_ROWS = min_rows
                row[f"sample_{name}_{impl}"] = timed(lambda: sample_on_device(logits, params, pos), iters=20) * 1e3
            sampler.TRITON_NUCLEUS_MIN_ROWS, sampler.KERNEL_SAMPLING = default_rows, True
            if sp.top_k < 1:  # top-p: kernels/sample.py; temperature alone: sample_temperature.py
                row[f"sample_{name}_kernel"] = timed(lambda: sample_on_device(logits, params, pos), iters=20) * 1e3
            if name.startswith("temperature"):
                continue
            t, k, q = (to_device([v] * b, x.device, dt) for v, dt in
                       ((sp.temperature, torch.float32), (sp.top_k, torch.int64), (sp.top_p, torch.float32)))
            for impl, fn in (("sorted_reference", reference.nucleus_threshold), ("triton", nucleus_threshold)):
                row[f"threshold_{name}_{impl}"] = timed(lambda: fn(x, t, k, q), iters=20) * 1e3
            if a.knobs and b in (1, 64, 256):  # the kernel's knobs
                for nc, block, warps in KNOBS:
                    fn = lambda: nucleus_threshold(x, t, k, q, candidates=nc, block=block, num_warps=warps)  # noqa: E731
                    row[f"threshold_{name}_triton_nc{nc}_b{block}_w{warps}"] = timed(fn, iters=20) * 1e3
        res["ms"][str(b)] = row
        print(b, " ".join(f"{key} {v:.3f}" for key, v in row.items() if "_nc" not in key), flush=True)
        if a.knobs and b in (1, 64, 256):
            for name in ("top_p", "top_k_top_p"):
                best = sorted((v, key) for key, v in row.items() if key.startswith(f"threshold_{name}_triton_nc"))
                print("   fastest", name, " ".join(f"{key.split('triton_')[1]} {v:.3f}" for v, key in best[:4]))
    Path(a.out).write_text(json.dumps(res, indent=1))


def temperature_knobs() -> dict:
    """sample_temperature alone (seeds and temperatures already on the device), ms per call of
    10 queued back to back (so mostly device time), by rows and (tokens per program, tokens per
    tile, warps)."""
    from pdserve.kernels.sample_temperature import MAX_CHUNKS, sample_temperature

    res: dict = {"gpu": torch.cuda.get_device_name(), "commit": source_commit(), "vocab": VOCAB, "ms": {}}
    for b in (1, 8, 64, 256):
        logits = (torch.randn(b, VOCAB, device="cuda") * 4).bfloat16()
        temps = torch.ones(b, device="cuda")
        seeds = torch.arange(b, dtype=torch.int64, device="cuda")
        row = {}
        for block in (512, 1024, 2048):
            for chunk in (1024, 2048, 4096, 8192, 16384, 32768):
                for warps in (4, 8):
                    if chunk < block or -(-VOCAB // chunk) > MAX_CHUNKS:
                        continue
                    fn = lambda: [sample_temperature(logits, temps, seeds, block=block, chunk=chunk,  # noqa: E731
                                                     num_warps=warps) for _ in range(10)]
                    row[f"c{chunk}_b{block}_w{warps}"] = timed(fn, iters=10) * 1e2  # 10 calls queued back to back
        res["ms"][str(b)] = row
        best = sorted((v, k) for k, v in row.items())[:5]
        print(b, "default", f"{timed(lambda: sample_temperature(logits, temps, seeds), iters=20) * 1e3:.3f}",
              "fastest", " ".join(f"{k} {v:.3f}" for v, k in best), flush=True)
    return res


if __name__ == "__main__":
    main()
