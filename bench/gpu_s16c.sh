#!/usr/bin/env bash
# Session 16's third device call: the engine bench's decode and loop sections for Llama-3.1-8B
# at HEAD (first H200 figures since session 13: the split heuristic and the top-p kernel of
# session 15 were measured on H100 only). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 540 python3 bench/engine.py --out "$OUT/engine-$g-$d-s16c-llama.json" --models llama-3.1-8b \
    --sections decode,loop 2>&1 | grep -v Warn | tail -40
