#!/usr/bin/env bash
# Session 26: where a 2k prompt's logprobs spend their time (bench/prompt_logprobs_probe.py),
# then, on an H200, the issue-9 loop figure (`bench/gpu_s22d.sh short`).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 120 python3 bench/prompt_logprobs_probe.py --out "$OUT/plp-probe-$g-$d-s26.json" 2>&1 | grep -v Warn | tail -40
[ "$g" = h200 ] && bash bench/gpu_s22d.sh short
exit 0
