#!/usr/bin/env bash
# Session 17's first device call: decode attention over head-major cache blocks against the
# pool's slot-major blocks (bench/layout_probe.py), the decode attention tests on the GPU, then
# the engine bench's loop section for Llama-3.1-8B at HEAD. Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 200 python3 bench/layout_probe.py --out "$OUT/layout-probe-$g-$d-s17.json" 2>&1 | grep -v Warn | tail -20
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_attention.py 2>&1 | tail -3
timeout 280 python3 bench/engine.py --out "$OUT/engine-$g-$d-s17-llama.json" --models llama-3.1-8b \
    --sections loop 2>&1 | grep -v Warn | tail -30
