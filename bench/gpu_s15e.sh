#!/usr/bin/env bash
# Session 15's fifth device call: the one-kernel temperature/top-p draw (kernels/sample.py) on
# the GPU: its tests and every gpu test, the sampler bench (kernel vs sorted vs threshold), and
# the sampled engine loop with the kernel on and off. Results under $OUT, named by the GPU.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_sample.py tests/runtime/test_sampler.py 2>&1 | tail -4
timeout 150 python3 bench/sampler.py --out "$OUT/sampler-$g-$d-${SUF:-s15e}.json" 2>&1 | grep -v Warn
timeout 330 python3 bench/engine.py --out "$OUT/engine-$g-$d-${SUF:-s15e}-llama.json" --models llama-3.1-8b --sections loop 2>&1 \
    | grep -A3 "sampled" | head -30
