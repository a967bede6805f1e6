#!/bin/bash
# Session 8 call C: A/B of fusions and PDL in the real decode step; fused tile sweep.
source "$(dirname "$0")/gpu_env.sh"
python3 bench/ab_decode.py --out $OUT/ab.json 2>&1 | grep -v Warn
python3 bench/bs1_probe.py --chain --out $OUT/chain.json 2>&1 | grep -v Warn
