#!/usr/bin/env bash
# Session 18's first device call: the persistent-layer probe (bench/persistent_probe.py) against
# the current batch-1 gemv chain, then the refactored layout probe once (0a55144). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 360 python3 bench/persistent_probe.py --layers 16 --out "$OUT/persistent-probe-$g-$d-s18a.json" 2>&1 | grep -v Warn
timeout 100 python3 bench/layout_probe.py 2>&1 | grep -v Warn | tail -8
