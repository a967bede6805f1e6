#!/usr/bin/env bash
# Session 22, short form of gpu_s22a.sh for a small remaining budget: the tests, the probe at
# 256 x 4k in 3 rounds, the engine loop figure.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kv_quant.py tests/kernels/test_decode_attention.py \
    tests/kernels/test_decode_rotary_attention.py tests/runtime/test_kv_quant_runtime.py 2>&1 | tail -3
timeout 100 python3 bench/pair_probe.py --batch 256 --rounds 3 --out "$OUT/pair-probe-$g-$d-s22c-256.json" 2>&1 | grep -v Warn
layers=6; [ "$g" = h200 ] && layers=16
timeout 200 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(layers=$layers)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s22c.json"
