#!/usr/bin/env bash
# Session 15's third device call: decode steps with the new split heuristic (2 programs per SM)
# against the old one (8), A/B in one process at batch 16/64/128 x 1k and 32 x 4k, then the
# engine's decode section (decode tok/s by batch, paged attention at 64 x 4k) at HEAD.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
for c in 16x1024 64x1024 128x1024 32x4096; do
    b=${c%x*}; ctx=${c#*x}
    timeout 120 python3 bench/ab_decode.py --variants fused,split8 --batch "$b" --ctx "$ctx" --rounds 4 --iters 50 \
        --out "$OUT/ab-decode-split-$g-$d-s15c-$c.json" 2>&1 | grep -v Warn | sed "s/^/$c /"
done
timeout 200 python3 bench/engine.py --out "$OUT/engine-$g-$d-s15c-llama.json" --models llama-3.1-8b --sections decode 2>&1 \
    | grep -A8 "paged_attention\|decode_tok_s_by_batch" | head -30
