#!/usr/bin/env bash
# Session 22's last call, on an H200 (needs_h200): the issue-9 figure (fp8 over bf16 through the
# engine loop at 256 x 4k, 16 layers) with the byte-pair kernel, then the probe at 256 x 4k.
# `bash bench/gpu_s22d.sh short`: the loop figure alone, 2 runs per variant (~200 s); `once`: 1 run.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
layers=6; [ "$g" = h200 ] && layers=16
reps=3; [ "${1:-}" = short ] && reps=2; [ "${1:-}" = once ] && reps=1
timeout 230 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(layers=$layers, reps=$reps)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s22d.json"
[ -n "${1:-}" ] && exit 0
timeout 80 python3 bench/pair_probe.py --batch 256 --rounds 3 --out "$OUT/pair-probe-$g-$d-s22d-256.json" 2>&1 | grep -v Warn
