#!/usr/bin/env bash
# Session 25: the GPU tests of logprobs and penalties (bench/gpu_s25.sh), then what logprobs and
# penalties cost in the engine loop (Llama-3.1-8B shape, dummy weights, greedy at 1k context,
# batch 1 and 256: plain, 5 logprobs, penalized with the Triton pass and with its torch twin).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
bash bench/gpu_s25.sh
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 300 python3 bench/engine.py --models llama-3.1-8b --sections extras --out "$OUT/engine-extras-$g-$d-s25c.json" \
    2>&1 | grep -v Warn | tail -24
