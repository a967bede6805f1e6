#!/usr/bin/env bash
# Session 24: the GPU tests at HEAD (7244f2c changed the decode kernel after session 23's GPU
# runs): the attention/quantization kernels, the quantized runtime and every gpu-marked runtime test.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kv_quant.py tests/kernels/test_decode_rotary_attention.py \
    tests/kernels/test_decode_attention.py tests/kernels/test_prefill_attention.py tests/runtime/test_kv_quant_runtime.py 2>&1 | tail -3
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime 2>&1 | tail -3
