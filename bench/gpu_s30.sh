#!/usr/bin/env bash
# Session 30 on any one GPU: the mixture-of-experts GPU tests (kernel, engine vs transformers,
# CUDA graphs), then bench/moe.py (Qwen3-30B-A3B shape, 16 of 48 layers) -> moe-<gpu>-<date>-s30.json
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_fused_moe.py tests/kernels/test_silu_and_mul.py \
    "tests/runtime/test_cuda.py" "tests/runtime/test_cuda_graph.py::test_graph_decode_equals_eager" 2>&1 | tail -15
timeout 260 python3 bench/moe.py --out "$OUT/moe-$g-$d-s30.json" --layers "${MOE_LAYERS:-16}" 2>&1 | grep -v Warn | tail -60
