"""How cuBLAS runs the decode GEMMs of a large batch, by weight layout (diagnostic, CUDA only).

    python bench/gemm_probe.py [--model llama-3.1-8b] [--batch 256]

For each projection of the model's shape, times x @ W^T with the weight stored [N, K] (how
pdserve keeps it: F.linear) and stored [K, N] (x @ Wt), with and without cuBLAS's reduced
precision split-K reduction, and prints microseconds and TFLOP/s beside the matmul rate of a
large square GEMM measured in the same run.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from engine import CONFIGS  # bench/ is on sys.path when run as a script
from pdserve.model.spec import ModelSpec


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2 * m * n * k / ms / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    spec = ModelSpec.from_config_dict(json.loads((CONFIGS / f"{args.model}.json").read_text()))
    hd = spec.head_dim
    shapes = {
        "qkv": ((spec.num_heads + 2 * spec.num_kv_heads) * hd, spec.hidden_size),
        "o": (spec.hidden_size, spec.num_heads * hd),
        "gate_up": (2 * spec.intermediate_size, spec.hidden_size),
        "down": (spec.hidden_size, spec.intermediate_size),
        "lm_head": (spec.vocab_size, spec.hidden_size),
    }
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ a, warmup=25, rep=200, return_mode="median")
    print(f"square 8192 matmul: {tflops(8192, 8192, 8192, ms):.0f} TFLOP/s", flush=True)
    m = args.batch
    total = {}
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        wt = w.t().contiguous()
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for reduced in (True, False):
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
            for layout, fn in (("[N,K]", lambda: F.linear(x, w)), ("[K,N]", lambda: x @ wt)):  # noqa: B023
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
                key = f"{layout} reduced={reduced}"
                total[key] = total.get(key, 0.0) + ms * (spec.num_layers if name != "lm_head" else 1)
                print(f"{name:8s} M={m} N={n} K={k} {key}: {ms * 1e3:7.1f} us "
                      f"{tflops(m, n, k, ms):5.0f} TFLOP/s", flush=True)
    for key, ms in total.items():
        print(f"per step (all layers + head) {key}: {ms:.3f} ms")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True


if __name__ == "__main__":
    main()
