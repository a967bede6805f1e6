#!/usr/bin/env bash
# Session 23: int8 caches read as byte pairs too (the default since 2026-12-07). The kernel and
# quantized-runtime tests on the GPU; bench/pair_probe.py at 256 x 4k (fp8 and int8 with and
# without pairs, bf16 beside them; HBM and L2-resident pages); the issue-9 figure (fp8 over bf16
# through the engine loop at 256 x 4k: 16 layers on an H200 (needs_h200), 6 on an H100 with
# int8 beside them).
# `bash bench/gpu_s23a.sh short`: no tests.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
if [ "${1:-}" != short ]; then
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kv_quant.py tests/kernels/test_decode_rotary_attention.py \
        tests/kernels/test_decode_attention.py tests/runtime/test_kv_quant_runtime.py 2>&1 | tail -3
fi
timeout 100 python3 bench/pair_probe.py --batch 256 --out "$OUT/pair-probe-$g-$d-s23a-256.json" 2>&1 | grep -v Warn
layers=6; int8=True; [ "$g" = h200 ] && layers=16 && int8=False  # int8 beside them on an H100 (memory, time)
timeout 230 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(layers=$layers, int8=$int8)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s23a.json"
