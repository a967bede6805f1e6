#!/bin/bash
# Branch next/l2-prefetch: verify on the GPU before it lands (gemv tests compiled, GPU tests)
# and A/B the L2 warm-up of the next projection's weights (4/8/16 MiB vs none) on both models.
source "$(dirname "$0")/gpu_env.sh"
python3 -m pytest -q tests/kernels/test_gemv.py 2>&1 | tail -2
python3 bench/ab_decode.py --out $OUT/ab.json --rounds 4 2>&1 | grep -v Warn
python3 bench/ab_decode.py --model qwen2.5-7b --out $OUT/ab_qwen.json --rounds 3 2>&1 | grep -v Warn
timeout 200 python3 -m pytest -q -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -3
