#!/usr/bin/env bash
# The engine bench's decode and loop sections for Llama-3.1-8B (issue 3's batch-1 and batch-256
# targets), results as engine-<gpu>-<date>-<tag>-llama.json: bash bench/gpu_engine_llama.sh TAG
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
f="$OUT/engine-$g-$d-$1-llama.json"
timeout 330 python3 bench/engine.py --out "$f" --models llama-3.1-8b --sections decode,loop 2>&1 | grep -v Warn | tail -5
python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); m = d["models"]["llama-3.1-8b"]
print("copy", d["copy_GBps"], "attn", d.get("paged_attention_bw_ratio"))
for k, v in m.items():
    if k != "weight_bytes":
        print(k, json.dumps(v)[:400])
PY
