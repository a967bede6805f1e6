#!/bin/bash
# Session 8 call E: kernels compiled at real shapes; A/B of the fusions in the decode step; profile.
source "$(dirname "$0")/gpu_env.sh"
python3 -m pytest -q tests/kernels 2>&1 | tail -2
python3 bench/ab_decode.py --out $OUT/ab.json --rounds 4 2>&1 | grep -v Warn
python3 bench/profile_decode.py --out $OUT/profile.json --batches 1,256 --ctx 128,1024 2>&1 | grep -v Warn | head -32
