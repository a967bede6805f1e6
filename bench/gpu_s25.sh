#!/usr/bin/env bash
# Session 25: the GPU tests of token logprobs and penalties (graphed vs eager logprobs, the
# overlapped CUDA-graph loop with penalties, the penalties kernel) and the sampler's.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_logprobs.py tests/runtime/test_penalties.py \
    tests/runtime/test_sampler.py tests/runtime/test_overlap.py 2>&1 | tail -4
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_penalties_kernel.py 2>&1 | tail -1
