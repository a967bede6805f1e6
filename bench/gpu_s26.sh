#!/usr/bin/env bash
# Session 26: the GPU tests of prompt logprobs (CUDA == CPU, one-token chunks kept off the
# graphs), of the penalties' warm-up (no new kernel variant after it) and the ones beside them
# (logprobs, penalties, runner); then `bench/engine.py --sections extras` (Llama-3.1-8B shape,
# dummy weights): what logprobs, penalties and a 2k prefill's 5 prompt logprobs cost.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_prompt_logprobs.py \
    tests/runtime/test_penalties.py tests/runtime/test_logprobs.py tests/runtime/test_runner.py 2>&1 | tail -4
[ "${1:-}" = tests ] && exit 0
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 300 python3 bench/engine.py --models llama-3.1-8b --sections extras --out "$OUT/engine-extras-$g-$d-s26.json" \
    2>&1 | grep -v Warn | tail -24
