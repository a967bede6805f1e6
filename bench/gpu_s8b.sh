#!/bin/bash
# Session 8 call B: one-pass norm gemv; chain probe (fusions x PDL); bs1 profiles with and without PDL.
source "$(dirname "$0")/gpu_env.sh"
set -x
python3 -m pytest -q tests/kernels/test_gemv.py 2>&1 | tail -3
python3 bench/bs1_probe.py --chain --out $OUT/chain.json 2>&1 | grep -v Warn
python3 bench/profile_decode.py --out $OUT/prof_pdl.json --batches 1,1 --ctx 128,4096 2>&1 | grep -v Warn | head -14
python3 bench/profile_decode.py --out $OUT/prof_nopdl.json --batches 1,1 --ctx 128,4096 --no-pdl 2>&1 | grep -v Warn | head -14
python3 bench/engine.py --out $OUT/engine.json --models llama-3.1-8b --sections decode --commit "$1" 2>&1 | grep -A3 '"decode_bs1_tok_s\|replay_only'
