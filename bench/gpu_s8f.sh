#!/bin/bash
# Session 8 call F: GPU tests, then the full engine benchmark (both models).
source "$(dirname "$0")/gpu_env.sh"
timeout 220 python3 -m pytest -q -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -3
python3 bench/engine.py --out $OUT/engine.json --commit "$1" 2>&1 | grep -v Warn | tail -40
