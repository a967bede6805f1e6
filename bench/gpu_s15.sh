#!/usr/bin/env bash
# Session 15's first device call: the batch-256 attention launch sweep (bench/attn_waves.py),
# then the Llama engine-loop figures at HEAD on the same GPU. Results under $OUT, named by the GPU.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 300 python3 bench/attn_waves.py --out "$OUT/attn-waves-$g-$d-s15.json" 2>&1 | grep -v Warn
timeout 250 python3 bench/engine.py --out "$OUT/engine-$g-$d-s15-llama.json" --models llama-3.1-8b --sections loop 2>&1 \
    | grep -A7 "sampled\|decode_loop_tok" | head -40
