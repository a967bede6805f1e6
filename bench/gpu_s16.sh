#!/usr/bin/env bash
# Session 16's first device call: split-K Triton GEMMs and cuBLAS call forms on the batch-256/128
# decode GEMMs (bench/splitk_probe.py), then every gpu test at HEAD. Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
(cd bench && timeout 260 python3 splitk_probe.py --batch 256 128) 2>&1 | grep -v Warn | tee "$OUT/splitk-probe-$g-$d-s16.log"
timeout 320 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ 2>&1 | tail -6
