#!/usr/bin/env bash
# One device call: CUDA runtime tests, then the engine benchmark (JSON to $OUT/engine.json).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-.}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_cuda.py tests/e2e/test_gpu_stack.py 2>&1 | tee $OUT/gpu_tests.log | tail -15
timeout 400 python3 bench/engine.py --out "$OUT/engine.json" 2>&1 | grep -v Warning | tail -60
