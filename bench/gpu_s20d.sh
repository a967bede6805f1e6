#!/usr/bin/env bash
# Session 20: sample_temperature's knobs (tokens per program, per tile, warps) at 1-256 rows.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 250 python3 bench/sampler.py --temperature-knobs --out "$OUT/sampler-knobs-$g-$d-s20d.json" 2>&1 | grep -v Warn
