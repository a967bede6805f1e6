#!/usr/bin/env bash
# Session 21's last H200 call if one comes (needs_h200): the issue-9 figure alone, fp8 over bf16
# decode through the engine loop at 256 x 4k, 16 layers, head-major blocks beside slot-major ones.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 300 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(slot_major=True)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s21b.json"
