#!/usr/bin/env bash
# Session 23: at batch 1 the qkv gemv warms 8/16/32 MiB of the o weight into L2 instead of 4
# (HBM idles through the attention between them), and every gemv's prefetch asks for each line
# once (before, programs past the budget asked for its last line again and again): A/B in one
# process (bench/ab_decode.py), Llama-3.1-8B batch 1 at 128 and 4k context.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
for ctx in 128 4096; do
    timeout 140 python3 bench/ab_decode.py --out "$OUT/ab-decode-pf-attn-$g-$d-s23b-ctx$ctx.json" --ctx $ctx \
        --rounds 5 --variants fused,pf_attn8,pf_attn16,pf_attn32 2>&1 | grep -v Warn
done
