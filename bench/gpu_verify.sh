#!/bin/bash
# One device call before a note: every kernel test compiled for the GPU, the gpu-marked tests,
# the full engine benchmark and the cuda_ipc transfer benchmark (with the attach-at-start A/B).
# Files to $OUT: engine.json, transfer.json. Usage: bash bench/gpu_verify.sh
source "$(dirname "$0")/gpu_env.sh"
timeout 200 python3 -m pytest -q tests/kernels 2>&1 | tail -2
timeout 220 python3 -m pytest -q -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -3
timeout 200 python3 bench/engine.py --out "$OUT/engine.json" 2>&1 | grep -v Warn | tail -30
timeout 200 python3 bench/transfer.py --out "$OUT/transfer.json" --backends cuda_ipc --reps 11 \
    --early-attach 2>&1 | grep -v Warn | grep -i "ttft\|copy"
