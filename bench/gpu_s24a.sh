#!/usr/bin/env bash
# Session 24, on an H200 (needs_h200): the issue-9 figure first (fp8 over bf16 through the
# engine loop at 256 x 4k, 16 layers, byte-pair kernel, 3 runs per variant), then
# bench/pair_probe.py at 256 x 4k (fp8/int8 pairs and bytes, bf16; HBM and L2-resident pages).
# `bash bench/gpu_s24a.sh short`: the loop figure alone, 2 runs per variant (~200 s).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
layers=6; [ "$g" = h200 ] && layers=16
reps=3; [ "${1:-}" = short ] && reps=2
timeout 330 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(layers=$layers, reps=$reps)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s24a.json"
[ "${1:-}" = short ] && exit 0
timeout 100 python3 bench/pair_probe.py --batch 256 --out "$OUT/pair-probe-$g-$d-s24a-256.json" 2>&1 | grep -v Warn
