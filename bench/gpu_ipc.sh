#!/usr/bin/env bash
# One device call (one GPU) for the cuda_ipc path: bench/ipc_probe.py, the cuda_ipc gpu tests and
# bench/transfer.py (via gpu_diag.sh), then a short disaggregated serve run with per-span times.
# Usage: bash bench/gpu_ipc.sh <commit>
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
timeout 90 python3 bench/ipc_probe.py 2>&1 | grep -v -i warn | tail -22
TESTS="tests/transfer/test_transfer_cuda_ipc.py tests/e2e/test_prefix_transfer.py" T_KVQ=0 T_PROF=0 T_KERN=0 T_KTESTS=0 \
    bash bench/gpu_diag.sh
bash bench/gpu_serve_spans.sh "${1:-unknown}"
