#!/usr/bin/env bash
# Session 17's first device call: decode attention over head-major cache blocks against the
# pool's slot-major blocks, the kernel alone (bench/layout_probe.py) and whole decode steps
# (bench/ab_decode.py, variant head_major: the same pool storage read head-major), and the
# head-major kernel tests on the GPU. Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 150 python3 bench/layout_probe.py --out "$OUT/layout-probe-$g-$d-s17.json" \
    --cases bf16:256x1024,bf16:64x4096,fp8:256x4096,fp8:64x4096 2>&1 | grep -v Warn | tail -12
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_attention.py \
    tests/kernels/test_decode_rotary_attention.py -k "head_major or interleaved" 2>&1 | tail -2
timeout 170 python3 bench/ab_decode.py --out "$OUT/ab-decode-layout-$g-$d-s17-bs256-ctx1024.json" --batch 256 \
    --ctx 1024 --variants fused,head_major --rounds 3 --iters 20 2>&1 | grep -v Warn
timeout 110 python3 bench/ab_decode.py --out "$OUT/ab-decode-layout-$g-$d-s17-bs1-ctx128.json" --batch 1 \
    --ctx 128 --variants fused,head_major --rounds 4 2>&1 | grep -v Warn
