#!/bin/bash
# Session 8 call A: fused norm/silu gemv + PDL: kernel tests, profiles with and without PDL, GPU tests, decode bench.
source "$(dirname "$0")/gpu_env.sh"
set -x
python3 -m pytest -q -x tests/kernels/test_gemv.py 2>&1 | tail -3
python3 bench/profile_decode.py --out $OUT/prof_pdl.json --batches 1,256 --ctx 128,1024 2>&1 | grep -v Warning
python3 bench/profile_decode.py --out $OUT/prof_nopdl.json --batches 1 --ctx 128 --no-pdl 2>&1 | grep -v Warning
python3 bench/engine.py --out $OUT/engine.json --models llama-3.1-8b --sections decode --commit "$1" 2>&1 | tail -25
timeout 200 python3 -m pytest -q -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -5
