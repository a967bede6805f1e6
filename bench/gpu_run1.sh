#!/usr/bin/env bash
# One device call: GPU tests (kernels, CUDA runtime vs transformers, two processes on one GPU)
# and the kernel benchmark. Usage on the GPU machine: bash bench/gpu_run1.sh  (OUT set by the tool)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-.}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers, google.protobuf as pb, grpc; print(torch.__version__, triton.__version__, transformers.__version__, pb.__version__, grpc.__version__)"
timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/kernels tests/runtime/test_cuda.py tests/e2e/test_gpu_stack.py 2>&1 | tee $OUT/gpu_tests.log | tail -40
timeout 200 python3 bench/kernel_bench.py --out "$OUT/kernels.json" 2>&1 | tail -30
