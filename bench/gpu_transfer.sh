#!/usr/bin/env bash
# One device call on ONE GPU: the cuda_ipc gpu tests (round trip, abort ordering), then
# bench/transfer.py with prefill and decode as two processes on the same GPU (JSON to
# $OUT/transfer.json). nccl is recorded as an error on one GPU (NCCL refuses two ranks on one
# device); it needs two GPUs. Usage: bash bench/gpu_transfer.sh [extra bench/transfer.py flags]
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider -s tests/transfer/test_transfer_cuda_ipc.py 2>&1 \
    | tee "$OUT/gpu_transfer_tests.log" | tail -15
timeout 420 python3 bench/transfer.py --out "$OUT/transfer.json" "$@" 2>&1 | grep -v -i warning | tail -40
