#!/usr/bin/env bash
# Session 30, last call on an H100: the MoE kernel tests (the Triton expert grouping) and the
# op probe (the grouping in CUDA graphs, Triton against torch). `--sweep` is the gemv knobs.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fused_moe.py tests/kernels/test_specialization.py 2>&1 | tail -3
timeout 120 python3 bench/moe_probe.py --out "$OUT/moe-probe-$g-$d-s30d.json" 2>&1 | grep -v Warn | grep -v "^ " | tail -12
