#!/usr/bin/env bash
# Session 13's second device call: the sort-free top-k/top-p sampler (kernels/nucleus.py) on the
# GPU: its kernel and sampler tests, bench/sampler.py (with a sweep of the kernel's knobs), then
# the Llama engine-loop figures (greedy and sampled). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_nucleus.py tests/runtime/test_sampler.py 2>&1 | tail -3
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
python3 bench/sampler.py --out "$OUT/sampler-$g-$d-s13.json" 2>&1 | grep -v Warn
python3 bench/engine.py --out "$OUT/engine-$g-$d-s13b-llama.json" --models llama-3.1-8b --sections loop 2>&1 \
    | grep -A3 "sampled\|decode_loop_tok" | head -40
