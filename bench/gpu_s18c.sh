#!/usr/bin/env bash
# Session 18, H100 (no H200 came): the persistent-layer probe's second grid (register caps, BK 2048,
# per-phase launches of the equal-slice kernel). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 200 python3 bench/persistent_probe.py --layers 16 --out "$OUT/persistent-probe-$g-$d-s18c.json" 2>&1 | grep -v Warn
