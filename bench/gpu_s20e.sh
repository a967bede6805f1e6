#!/usr/bin/env bash
# Session 20: the whole engine bench (every section, both models) and the sampling bench,
# at 8192 tokens per program for temperature-only draws. Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
s=${1:-s20e}
timeout 100 python3 bench/sampler.py --out "$OUT/sampler-$g-$d-$s.json" 2>&1 | grep -v Warn | grep -o "^[0-9]* \|sample_temperature[a-z_]* [0-9.]*" | tr '\n' ' '; echo
timeout 450 python3 bench/engine.py --out "$OUT/engine-$g-$d-$s.json" 2>&1 | grep -v Warn | tail -3
python3 - "$OUT/engine-$g-$d-$s.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("copy", round(d["copy_GBps"]), "matmul", round(d["matmul_TFLOPs"]), "attn ratio", d.get("paged_attention_bw_ratio"))
for name, m in d["models"].items():
    for k, v in m.items():
        if k != "weight_bytes":
            print(name, k, json.dumps(v)[:260])
PY
