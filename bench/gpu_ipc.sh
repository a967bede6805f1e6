#!/usr/bin/env bash
# One device call (one GPU) for the cuda_ipc path: bench/ipc_probe.py, the cuda_ipc gpu tests and
# bench/transfer.py (via gpu_diag.sh), then a short disaggregated serve run with per-span times.
# Usage: bash bench/gpu_ipc.sh <commit>
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
timeout 90 python3 bench/ipc_probe.py 2>&1 | grep -v -i warn | tail -22
TESTS="tests/transfer/test_transfer_cuda_ipc.py tests/e2e/test_prefix_transfer.py" T_KVQ=0 T_PROF=0 T_KERN=0 T_KTESTS=0 \
    bash bench/gpu_diag.sh
SERVE_BUDGET=100 SERVE_TIMEOUT=170 bash bench/gpu_serve.sh "${1:-unknown}" --modes disaggregated \
    --kv-transfer cuda_ipc --rates 8,16 --num-prompts 48 --num-warmups 4 --trace 2>&1 | grep "rate " | tail -4
python3 - "$OUT"/serve-*.json <<'PY'
import json, sys
for mode, m in json.load(open(sys.argv[1]))["modes"].items():
    for name, s in sorted(m.get("span_ms", {}).items()):
        print(f"{mode:14s} {name:18s} n={s['count']:4d} p50 {s['p50_ms']:9.1f} p90 {s['p90_ms']:9.1f} ms")
PY
