#!/usr/bin/env bash
# Session 19: the attention kernel tests compiled for the GPU and the gpu-marked runtime and
# end-to-end tests (the real-process stacks now run ModelRunner.warm_up() at start-up).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_attention.py \
    tests/kernels/test_prefill_attention.py tests/kernels/test_kv_quant.py tests/kernels/test_specialization.py 2>&1 | tail -2
timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime tests/e2e tests/transfer \
    --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -4
