#!/usr/bin/env bash
# Session 30, last call on an H100: the gemv path's tile sweep, then bench/moe.py again.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 120 python3 bench/moe_probe.py --sweep --out "$OUT/moe-sweep-$g-$d-s30d.json" 2>&1 | grep -v Warn | tail -8
timeout 200 python3 bench/moe.py --out "$OUT/moe-$g-$d-s30d.json" --layers 16 2>&1 | grep -v Warn \
    | grep -E '"(decode_bs1_tok_s|decode_bs1_active_roofline_ratio|1|8|32|64|128|prefill_tok_s_2048)"'
