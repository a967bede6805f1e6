#!/usr/bin/env bash
# Session 15's fourth device call: the batch-1 split launch's fixed cost (bf16 vs fp8, kernel by
# kernel), the fp8/bf16 engine-loop decode speedup at 256 x 4k, and the Llama engine-loop figures
# with the new split heuristic. Results under $OUT, named by the GPU.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 90 python3 bench/attn_waves.py --floor --out "$OUT/attn-floor-$g-$d-s15d.json" 2>&1 | grep -v Warn
timeout 200 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup()))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s15d.json"
timeout 250 python3 bench/engine.py --out "$OUT/engine-$g-$d-s15d-llama.json" --models llama-3.1-8b --sections loop 2>&1 \
    | grep -A7 "decode_loop_tok_s_by\|ctx128" | head -24
