#!/usr/bin/env bash
# Session 26, one call for whichever GPU comes: where a 2k prompt's logprobs spend their time
# (bench/prompt_logprobs_probe.py), the extras figures (bench/engine.py --sections extras; at
# 18d7398 they timed sampler.TOPK_FROM_LOGITS off and on, removed after that run), and on an
# H200 the issue-9 loop figure (gpu_s22d.sh short).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 120 python3 bench/prompt_logprobs_probe.py --out "$OUT/plp-probe-$g-$d-s26c.json" 2>&1 | grep -v Warn | tail -40
timeout 240 python3 bench/engine.py --models llama-3.1-8b --sections extras --out "$OUT/engine-extras-$g-$d-s26c.json" \
    2>&1 | grep -v Warn | tail -34
[ "$g" = h200 ] && bash bench/gpu_s22d.sh short
exit 0
