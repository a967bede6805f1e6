#!/usr/bin/env bash
# Part of a device call: a short disaggregated serve run over cuda_ipc with tracing, then the
# p50/p90 of each span kind. Usage: bash bench/gpu_serve_spans.sh <commit>   (files to $OUT)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
SERVE_BUDGET=100 SERVE_TIMEOUT=170 bash bench/gpu_serve.sh "${1:-unknown}" --modes disaggregated \
    --kv-transfer cuda_ipc --rates 8,16 --num-prompts 48 --num-warmups 4 --trace 2>&1 | grep "rate " | tail -4
python3 - "$OUT"/serve-*.json <<'PY'
import json, sys
for mode, m in json.load(open(sys.argv[1]))["modes"].items():
    for name, s in sorted(m.get("span_ms", {}).items()):
        print(f"{mode:14s} {name:18s} n={s['count']:4d} p50 {s['p50_ms']:9.1f} p90 {s['p90_ms']:9.1f} ms")
PY
