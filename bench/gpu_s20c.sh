#!/usr/bin/env bash
# Session 20: temperature-only sampling split over programs (kernels/sample_temperature.py).
# Its kernel and sampler tests on the GPU, the sampling bench (every path at 1-256 rows of a
# 128k vocab), then the engine loop section for Llama-3.1-8B (temperature-only rows with the
# Triton draw on and off). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_sample_temperature.py tests/kernels/test_sample.py \
    tests/runtime/test_sampler.py tests/kernels/test_specialization.py 2>&1 | tail -3
timeout 150 python3 bench/sampler.py --out "$OUT/sampler-$g-$d-s20c.json" 2>&1 | grep -v Warn | cut -c1-900
timeout 270 python3 bench/engine.py --out "$OUT/engine-$g-$d-s20c-llama.json" --models llama-3.1-8b --sections loop 2>&1 | grep -v Warn | tail -3
python3 - "$OUT/engine-$g-$d-s20c-llama.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["models"]["llama-3.1-8b"]
for k, v in m.items():
    if k.startswith("decode_loop"):
        print(k, json.dumps(v)[:300])
PY
