#!/usr/bin/env bash
# Session 30, last call on an H100: the gemv path's tile sweep.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 120 python3 bench/moe_probe.py --sweep --out "$OUT/moe-sweep-$g-$d-s30d.json" 2>&1 | grep -v Warn | tail -8
