"""Sampling cost per decode step on one CUDA GPU: the sort-free top-k/top-p (Triton
nucleus_threshold, the sampler since 2026-12-05) against the sorted sampler before it.

    python bench/sampler.py --out bench/results/sampler-<gpu>-<date>.json

Logits [B, 128256] (Llama-3's vocab) in bf16 as the model gives them, B = 1, 32, 256;
temperature 1 and top-p 0.9 (the engine loop's sampled figures), and top-k 50 + top-p 0.9.
Times sample_on_device whole (upcast, probabilities, the exponential race) and the threshold
alone, with its sorted reference twin; the floor is one read of the fp32 logits at the copy
bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
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


def sorted_token_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """token_probs as it was before 2026-12-05 (sort, mask by rank and cumulative mass, scatter back)."""
    dev = logits.device
    x = logits / to_device([p.temperature for p in params], dev, logits.dtype)[:, None]
    v = x.shape[-1]
    sorted_x, idx = x.sort(dim=-1, descending=True)
    ks = to_device([p.top_k if p.top_k >= 1 else v for p in params], dev)
    sorted_x.masked_fill_(torch.arange(v, device=dev)[None, :] >= ks[:, None], float("-inf"))
    sp = sorted_x.softmax(dim=-1)
    top_p = to_device([p.top_p if p.top_p < 1.0 else float("inf") for p in params], dev, torch.float32)
    sorted_x.masked_fill_((sp.cumsum(dim=-1) - sp) >= top_p[:, None], float("-inf"))
    return torch.full_like(x, float("-inf")).scatter_(-1, idx, sorted_x).softmax(dim=-1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    gbps = copy_bandwidth()
    res: dict = {"gpu": torch.cuda.get_device_name(), "commit": source_commit(), "copy_GBps": gbps,
                 "vocab": VOCAB, "triton_min_rows": sampler.TRITON_NUCLEUS_MIN_ROWS, "ms": {}}
    settings = {"top_p": SamplingParams(temperature=1.0, top_p=0.9),
                "top_k_top_p": SamplingParams(temperature=1.0, top_k=50, top_p=0.9)}
    new = sampler.token_probs
    for b in (1, 32, 256):
        logits = (torch.randn(b, VOCAB, device="cuda") * 4).bfloat16()
        row: dict = {"floor_fp32_read": b * VOCAB * 4 / (gbps * 1e9) * 1e3}
        for name, sp in settings.items():
            params, pos = [sp] * b, list(range(b))
            for impl, fn in (("sorted", sorted_token_probs), ("threshold", new)):
                sampler.token_probs = fn
                row[f"sample_{name}_{impl}"] = timed(lambda: sample_on_device(logits, params, pos), iters=20) * 1e3
            sampler.token_probs = new
            x = logits.float()
            t = to_device([sp.temperature] * b, x.device, torch.float32)
            k = to_device([sp.top_k] * b, x.device)
            q = to_device([sp.top_p] * b, x.device, torch.float32)
            for impl, fn in (("sorted_reference", reference.nucleus_threshold), ("triton", nucleus_threshold)):
                row[f"threshold_{name}_{impl}"] = timed(lambda: fn(x, t, k, q), iters=20) * 1e3
        if b in (1, 256):  # the kernel's knobs, top-p only
            for nc in (4, 8, 16):
                for block, warps in ((512, 4), (1024, 4), (1024, 8), (2048, 8), (2048, 16)):
                    fn = lambda: nucleus_threshold(x, t, k, q, candidates=nc, block=block, num_warps=warps)  # noqa: E731
                    row[f"threshold_top_k_top_p_triton_nc{nc}_b{block}_w{warps}"] = timed(fn, iters=20) * 1e3
            t, k, q = (to_device([v] * b, x.device, dt) for v, dt in ((1.0, torch.float32), (0, torch.int64),
                                                                       (0.9, torch.float32)))
            for nc in (4, 8, 16):
                for block, warps in ((512, 4), (1024, 4), (1024, 8), (2048, 8), (2048, 16)):
                    fn = lambda: nucleus_threshold(x, t, k, q, candidates=nc, block=block, num_warps=warps)  # noqa: E731
                    row[f"threshold_top_p_triton_nc{nc}_b{block}_w{warps}"] = timed(fn, iters=20) * 1e3
        res["ms"][str(b)] = row
        print(b, " ".join(f"{key} {v:.3f}" for key, v in row.items()), flush=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
