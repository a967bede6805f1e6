#!/usr/bin/env bash
# Session 17's third device call (needs an H200: both 16-layer pools of 256 x 4k): the issue-9
# figure, fp8 over bf16 decode through the engine loop, with head-major quantized blocks; then the
# engine bench's loop section for Llama-3.1-8B at HEAD. Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 220 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup()))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s17c.json"
timeout 300 python3 bench/engine.py --out "$OUT/engine-$g-$d-s17c-llama.json" --models llama-3.1-8b --sections loop 2>&1 \
    | grep -A7 "decode_loop_tok_s_by\|ctx128" | head -24
