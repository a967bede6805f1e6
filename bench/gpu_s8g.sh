#!/bin/bash
# Session 8 call G: the fusions' A/B on the Qwen2.5-7B shape; decode-only engine run of both models.
source "$(dirname "$0")/gpu_env.sh"
python3 bench/ab_decode.py --model qwen2.5-7b --out $OUT/ab_qwen.json --rounds 4 2>&1 | grep -v Warn
python3 bench/engine.py --out $OUT/engine_decode.json --sections decode --commit "$1" 2>&1 | grep -A2 '"decode_bs1_tok_s\|"256"'
