#!/usr/bin/env bash
# Session 20: after the compile fix (s19), disaggregated (cuda_ipc) beside colocated on one
# shared GPU at rates 32 and 64 (64 prompts each, spans on); the workers' warm-up now also
# compiles the temperature-sampling kernels. Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
timeout 400 python3 bench/serve_matrix.py --commit "$(cat .commit)" --out-dir "$OUT" --budget-s 330 \
    --modes disaggregated,colocated --kv-transfer cuda_ipc --rates 32,64 --num-prompts 64 --num-warmups 4 \
    --trace > "$OUT/serve.log" 2>&1; echo "rc $?"
grep -i "rate \|warm" "$OUT/serve.log" | tail -12
python3 - "$OUT"/serve-*.json <<'PY'
import json, sys
for mode, m in json.load(open(sys.argv[1]))["modes"].items():
    for name, s in sorted(m.get("span_ms", {}).items()):
        print(f"{mode:14s} {name:18s} n={s['count']:4d} p50 {s['p50_ms']:9.1f} p90 {s['p90_ms']:9.1f} ms")
PY
