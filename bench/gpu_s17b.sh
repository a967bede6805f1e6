#!/usr/bin/env bash
# Session 17's second device call: quantized pools with head-major value blocks (kv_quant,
# 2026-12-06). The quantized kernel and runtime tests on the GPU, then fp8 decode through the
# engine loop at 256 x 4k with head-major against slot-major blocks (12 layers, fits an H100),
# and on an H200 the issue-9 figure (fp8 over bf16, 16 layers). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kv_quant.py tests/runtime/test_kv_quant_runtime.py \
    tests/kernels/test_decode_rotary_attention.py -k "quant or fp8 or int8 or head_major" 2>&1 | tail -2
timeout 200 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_layout_ab()))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-layout-ab-$g-$d-s17b.json"
if [ "$g" = h200 ]; then
    timeout 200 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup()))" \
        2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s17b.json"
fi
