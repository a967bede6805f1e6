#!/usr/bin/env bash
# Session 21: the paged decode kernel's compute floor (bench/l2_floor.py: the 256 x 4k launch
# over pages that stay in L2), fp8 and bf16, on whatever GPU comes.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 150 python3 bench/l2_floor.py --out "$OUT/l2-floor-$g-$d-s21c.json" 2>&1 | grep -v Warn
