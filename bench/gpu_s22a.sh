#!/usr/bin/env bash
# Session 22: fp8 decode attention reading the cache as byte pairs, offsets in 32-bit arithmetic
# (both the default since 2026-12-07): the kernel and quantized-runtime tests on the GPU,
# bench/pair_probe.py at 256 x 4k (served kernel with and without each change, bf16 beside it;
# HBM and L2-resident pages), the engine loop's fp8 over bf16 figure at 256 x 4k (16 layers on an
# H200, 6 on an H100), then the probe at 64 x 4k.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kv_quant.py tests/kernels/test_decode_rotary_attention.py \
    tests/kernels/test_decode_attention.py tests/runtime/test_kv_quant_runtime.py 2>&1 | tail -3
timeout 120 python3 bench/pair_probe.py --batch 256 --out "$OUT/pair-probe-$g-$d-s22a-256.json" 2>&1 | grep -v Warn
layers=6; [ "$g" = h200 ] && layers=16
timeout 230 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(layers=$layers)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s22a.json"
timeout 90 python3 bench/pair_probe.py --batch 64 --out "$OUT/pair-probe-$g-$d-s22a-64.json" 2>&1 | grep -v Warn
