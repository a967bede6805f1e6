"""Tile sweep of the block-copy kernel (pdserve/kernels/copy_blocks.PoolCopy), every layer in one launch,
on an 8k-token Llama-3.1-8B-layout pool (1 GiB), against a plain device copy of the same bytes.

    python bench/copy_sweep.py [--out FILE]   (CUDA)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from transfer import LLAMA_8B, pool_for  # noqa: E402

from pdserve.kernels.copy_blocks import PoolCopy  # noqa: E402


def median_s(fn, reps: int = 20) -> float:
    times = []
    for i in range(reps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="", help="JSON file to write")
    a = p.parse_args()
    n, dev = 512, torch.device("cuda")
    src, dst = pool_for(LLAMA_8B, n, dev), pool_for(LLAMA_8B, n, dev)
    nbytes = src.numel() * src.element_size()
    flat_s, flat_d = src.view(-1), dst.view(-1)
    copy = nbytes / median_s(lambda: flat_d.copy_(flat_s)) / 1e9
    print(f"device copy {copy:.1f} GB/s ({nbytes / 2**20:.0f} MiB, bytes counted once)", flush=True)
    ids = torch.randperm(n, device=dev).to(torch.int32)
    rows = []
    for words in (1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):
            plan = PoolCopy(src, dst, words_per_program=words, num_warps=warps)
            gbps = nbytes / median_s(lambda: plan(ids, ids)) / 1e9
            rows.append({"words_per_program": words, "num_warps": warps, "GBps": gbps, "ratio_to_copy": gbps / copy})
            print(f"words/program {words:5d} warps {warps:2d}: {gbps:7.1f} GB/s ({gbps / copy:.3f} of copy)",
                  flush=True)
    if a.out:
        doc = {"gpu": torch.cuda.get_device_name(dev), "date": datetime.date.today().isoformat(),
               "command": "python " + " ".join(sys.argv), "copy_GBps": copy, "sweep": rows}
        Path(a.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
