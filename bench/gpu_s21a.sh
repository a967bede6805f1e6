#!/usr/bin/env bash
# Session 21: the wgmma probe (bench/wgmma_probe.py: fp8 decode attention with the KV tile as the
# warpgroup MMA's M dimension) against the served kernel at 256 x 4k and 64 x 4k; on an H200 also
# the issue-9 loop figure (gpu_s20f.sh's line). Ran on an H100 at fcae717 with the kv-major form
# built into the served kernel (dropped after it: see bench/wgmma_probe.py); here without it.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 150 python3 bench/wgmma_probe.py --batch 256 --out "$OUT/wgmma-probe-$g-$d-s21a-256.json" 2>&1 | grep -v Warn
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kv_quant.py tests/kernels/test_decode_rotary_attention.py 2>&1 | tail -3
timeout 60 python3 bench/wgmma_probe.py --batch 64 --out "$OUT/wgmma-probe-$g-$d-s21a-64.json" 2>&1 | grep -v Warn
if [ "$g" = h200 ]; then  # 16 layers (three pools) need more than an H100 holds
    timeout 220 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup()))" \
        2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s21a.json"
else
    timeout 200 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(layers=6)))" \
        2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s21a.json"
fi
