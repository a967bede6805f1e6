#!/bin/bash
# Session 8 call H (last): every kernel test compiled, the GPU tests, decode-only engine run.
source "$(dirname "$0")/gpu_env.sh"
python3 -m pytest -q tests/kernels 2>&1 | tail -2
timeout 200 python3 -m pytest -q -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -3
python3 bench/engine.py --out $OUT/engine_decode.json --sections decode --commit "$1" 2>&1 | grep -A2 '"decode_bs1_tok_s\|"256"'
