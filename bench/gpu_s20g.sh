#!/usr/bin/env bash
# Session 20: the gpu-marked runtime tests at the end of the session (warm-up with a
# temperature row, overlapped sampled loops, CUDA graphs vs eager), and the runner's warm-up test.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime 2>&1 | tail -3
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_runner.py -k warm_up 2>&1 | tail -2
