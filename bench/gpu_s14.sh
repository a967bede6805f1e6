#!/usr/bin/env bash
# Session 14's device call: the sampler's two top-k/top-p paths (sorted below
# TRITON_NUCLEUS_MIN_ROWS rows, the Triton nucleus_threshold from there) with the kernel's
# retuned defaults: their tests, bench/sampler.py at 1 ... 256 rows with a knob sweep, then the
# Llama engine-loop figures (greedy and sampled). Results under $OUT, named by the GPU.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_nucleus.py tests/runtime/test_sampler.py 2>&1 \
    | grep -E "passed|failed|Error|assert" | head -20
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
python3 bench/sampler.py --out "$OUT/sampler-$g-$d-s14.json" 2>&1 | grep -v Warn
python3 bench/engine.py --out "$OUT/engine-$g-$d-s14-llama.json" --models llama-3.1-8b --sections loop 2>&1 \
    | grep -A7 "sampled\|decode_loop_tok" | head -40
