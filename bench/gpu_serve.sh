#!/usr/bin/env bash
source "$(dirname "$0")/gpu_env.sh"
# One device call: bench/serve_matrix.py (disaggregated, colocated, transformers x request rates), JSON + PNG
# + logs to $OUT. Usage: bash bench/gpu_serve.sh <commit> [extra serve_matrix.py flags]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-.}"
COMMIT="${1:-unknown}"
shift || true
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout "${SERVE_TIMEOUT:-450}" python3 bench/serve_matrix.py --commit "$COMMIT" --out-dir "$OUT" \
    --budget-s "${SERVE_BUDGET:-360}" "$@" > "$OUT/serve.log" 2>&1
echo "== serve_matrix rc $?"
grep -v -i warning "$OUT/serve.log" | tail -70
