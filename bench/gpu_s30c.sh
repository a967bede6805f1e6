#!/usr/bin/env bash
# Session 30, third call: the MoE GPU tests (fused routing, gemv down with the sum), the op
# probe and bench/moe.py -> moe-probe-<gpu>-<date>-s30c.json, moe-<gpu>-<date>-s30c.json
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 170 python3 -m pytest -q -p no:cacheprovider -s tests/kernels/test_fused_moe.py tests/kernels/test_moe_route.py \
    tests/kernels/test_specialization.py tests/runtime/test_cuda.py "tests/runtime/test_cuda_graph.py::test_graph_decode_equals_eager" \
    2>&1 | grep -E "passed|failed|FAILED|Error|ours-vs" | tail -20
timeout 150 python3 bench/moe_probe.py --out "$OUT/moe-probe-$g-$d-s30c.json" 2>&1 | grep -v Warn | tail -30
timeout 200 python3 bench/moe.py --out "$OUT/moe-$g-$d-s30c.json" --layers 16 2>&1 | grep -v Warn \
    | grep -E '"(decode_bs1_tok_s|decode_bs1_active_roofline_ratio|1|8|32|64|128|prefill_tok_s_2048|fused_ms|fused_copy_ratio|fused_matmul_ratio)"'
