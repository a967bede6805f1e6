#!/usr/bin/env bash
# Session-4 device call: gateway overhead pinned (A/B), the 2k TTFT breakdown of a cuda_ipc
# transfer, then a short disaggregated cuda_ipc serve run with spans. Keeps under 8 files in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
REPEAT=1 PREV=.prev bash bench/gpu_gateway.sh 2>&1 | grep -v -i warn | tail -14
source bench/gpu_env.sh
timeout 100 python3 bench/ipc_probe.py 2>&1 | grep -E "^ttft|start |finish " | tail -12
bash bench/gpu_serve_spans.sh "${1:-unknown}"
rm -rf "$OUT"/logs "$OUT"/traces-*.jsonl "$OUT"/*.png
ls "$OUT"
