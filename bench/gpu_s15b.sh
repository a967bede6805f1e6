#!/usr/bin/env bash
# Session 15's second device call: decode attention's partition sweep (bf16 and fp8, batch
# 1-256 x 1k/4k: bench/attn_waves.py --parts), then every gpu-marked test at HEAD.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 240 python3 bench/attn_waves.py --parts --out "$OUT/attn-parts-$g-$d-s15b.json" 2>&1 | grep -v Warn
timeout 330 python3 -m pytest -q -p no:cacheprovider -rfs -m gpu tests/ 2>&1 | grep -E "passed|failed|Error|assert|SKIP" | head -20
