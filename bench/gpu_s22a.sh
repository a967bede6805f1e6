#!/usr/bin/env bash
# Session 22: bench/pair_probe.py (fp8 cache read as e4m3 pairs) against the served kernel at
# 256 x 4k and 64 x 4k, over HBM and over L2-resident pages (the compute floor).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
for b in 256 64; do
    timeout 200 python3 bench/pair_probe.py --batch $b --out "$OUT/pair-probe-$g-$d-s22a-$b.json" 2>&1 | grep -v Warn
done
