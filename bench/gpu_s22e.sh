#!/usr/bin/env bash
# Session 22, for a budget under 250 s on an H200 (needs_h200): the issue-9 loop figure alone,
# 2 runs per variant.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
layers=6; [ "$g" = h200 ] && layers=16
timeout 200 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(layers=$layers, reps=2)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s22e.json"
