#!/usr/bin/env bash
# Session 25's last device budget (~280 s with a machine start): the issue-9 loop figure with
# one run per variant (bench/gpu_s22d.sh short takes two), H200 only (16 layers).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
[ "$g" = h200 ] || { echo "not an H200: $g"; exit 3; }
timeout 150 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(layers=16, reps=1)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s25d.json"
