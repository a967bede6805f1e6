#!/usr/bin/env bash
# Session 18: gemv tests on the GPU, the batch-1 A/B of gemv tile plans (sweep vs slices) for
# Llama-3.1-8B at 128 and 4k context, then on an H200 only the issue-9 figure (fp8 over bf16
# through the engine loop at 256 x 4k, 16 layers, head-major quantized blocks). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py 2>&1 | tail -2
timeout 120 python3 bench/ab_decode.py --out "$OUT/ab-decode-slices-$g-$d-s18d-bs1-ctx128.json" --batch 1 \
    --ctx 128 --variants fused,slices --rounds 5 2>&1 | grep -v Warn
timeout 100 python3 bench/ab_decode.py --out "$OUT/ab-decode-slices-$g-$d-s18d-bs1-ctx4096.json" --batch 1 \
    --ctx 4096 --variants fused,slices --rounds 4 2>&1 | grep -v Warn
if [ "$g" = h200 ]; then
    timeout 170 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup()))" \
        2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s18d.json"
fi
