#!/usr/bin/env bash
# Session 19: how often a fresh prefill worker's forward waits for Triton to compile
# (bench/jit_variants.py), first with an empty Triton cache, then again in a second process
# (kernels now on disk). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
export TRITON_CACHE_DIR=/tmp/triton-s19a
rm -rf "$TRITON_CACHE_DIR"
timeout 240 python3 bench/jit_variants.py --out "$OUT/jit-variants-$g-$d-s19a-cold.json" 2>&1 | grep -v Warn | tail -60
timeout 120 python3 bench/jit_variants.py --seed 1 --out "$OUT/jit-variants-$g-$d-s19a-disk.json" 2>&1 | grep -v Warn | tail -25
