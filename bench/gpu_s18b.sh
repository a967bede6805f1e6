#!/usr/bin/env bash
# Session 18's H200 call: the issue-9 figure at 16 layers (fp8 over bf16 decode through the engine
# loop at 256 x 4k, head-major quantized blocks), the persistent-layer probe, then the engine
# bench's loop section for Llama-3.1-8B. Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 150 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup()))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s18b.json"
timeout 170 python3 bench/persistent_probe.py --layers 16 --out "$OUT/persistent-probe-$g-$d-s18b.json" 2>&1 | grep -v Warn
timeout 200 python3 bench/engine.py --out "$OUT/engine-$g-$d-s18b-llama.json" --models llama-3.1-8b --sections loop 2>&1 \
    | grep -A7 "decode_loop_tok_s_by\|ctx128" | head -24
