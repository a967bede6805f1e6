#!/bin/bash
# Session 8 call D: gemv with programmatic dependent launch (first weight tile read before the wait).
source "$(dirname "$0")/gpu_env.sh"
python3 -m pytest -q tests/kernels/test_gemv.py tests/kernels/test_decode_attention.py tests/kernels/test_rms_norm.py tests/kernels/test_silu_and_mul.py 2>&1 | tail -2
python3 bench/ab_decode.py --out $OUT/ab.json --rounds 5 2>&1 | grep -v Warn
timeout 200 python3 -m pytest -q -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -3
