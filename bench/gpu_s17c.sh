#!/usr/bin/env bash
# Session 17's third device call: the issue-9 figure, fp8 over bf16 decode through the engine
# loop at 256 x 4k with head-major quantized blocks. On an H200: 16 layers (as sessions 11-13);
# on an H100 (where both 16-layer pools do not fit): 6 layers, with the slot-major fp8 layout of
# before as a third runner in the same run. Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
if [ "$g" = h200 ]; then args=""; else args="layers=6, slot_major=True"; fi
timeout 300 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup($args)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s17c.json"
