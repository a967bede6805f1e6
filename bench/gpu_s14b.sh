#!/usr/bin/env bash
# Session 14's second device call: every gpu-marked test at HEAD but the openai-client one (no
# openai package on the device), with the nucleus kernel's new defaults (2 candidates per pass
# over 4096-token tiles), then bench/sampler.py and the Llama engine-loop figures (greedy and
# sampled) as in gpu_s14.sh. Results under $OUT, named by the GPU.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
python3 -m pytest -q -p no:cacheprovider -rf -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | grep -E "passed|failed|Error|assert" | head -20
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
python3 bench/sampler.py --out "$OUT/sampler-$g-$d-s14b.json" 2>&1 | grep -v Warn
python3 bench/engine.py --out "$OUT/engine-$g-$d-s14b-llama.json" --models llama-3.1-8b --sections loop 2>&1 \
    | grep -A7 "sampled\|decode_loop_tok" | head -40
