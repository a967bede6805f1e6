#!/usr/bin/env bash
# Session 25, the Triton penalties kernel: its tests on the GPU, then the engine-loop cost of
# logprobs and penalties with the kernel and with its torch twin (bench/engine.py extras).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_penalties_kernel.py \
    tests/runtime/test_penalties.py 2>&1 | tail -2
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 300 python3 bench/engine.py --models llama-3.1-8b --sections extras --out "$OUT/engine-extras-$g-$d-s25c.json" \
    2>&1 | grep -v Warn | tail -24
