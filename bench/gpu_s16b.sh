#!/usr/bin/env bash
# Session 16's second device call: decode graphs captured over a short block table (one attention
# partition at <= 256 tokens: no split, no merge kernel) against the model-length table, in one
# process per case (bench/ab_decode.py). Results under $OUT.
# The saved ab-decode-table-h200-2026-12-06-s16b-*.json came from this script at 13b8af0, where
# the runtime itself kept short-table graphs: there "fused" had them and "no_short" did not
# (variants fused,no_short,table1k). That change was reverted (38ca071, no gain); here the same
# comparison is "table256" (graphs over a 256-token table) against "fused".
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 170 python3 bench/ab_decode.py --out "$OUT/ab-decode-table-$g-$d-s16b-bs1-ctx128.json" --batch 1 --ctx 128 \
    --variants fused,table256,table1k --rounds 5 2>&1 | grep -v Warn
timeout 130 python3 bench/ab_decode.py --out "$OUT/ab-decode-table-$g-$d-s16b-bs1-ctx1000.json" --batch 1 --ctx 1000 \
    --variants fused,table1k --rounds 5 2>&1 | grep -v Warn
timeout 130 python3 bench/ab_decode.py --out "$OUT/ab-decode-table-$g-$d-s16b-bs8-ctx128.json" --batch 8 --ctx 128 \
    --variants fused,table256 --rounds 5 2>&1 | grep -v Warn
