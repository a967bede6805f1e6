#!/usr/bin/env bash
# Session 20's first H200 call: the issue-9 figure at 16 layers (fp8 over bf16 decode through the
# engine loop at 256 x 4k, head-major blocks beside the old slot-major ones), then the engine
# bench's decode and loop sections for Llama-3.1-8B (batch-1 and batch-256 targets of issue 3).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 230 python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup(slot_major=True)))" \
    2>&1 | grep -v Warn | tee "$OUT/kvquant-loop-$g-$d-s20a.json"
bash "$(dirname "${BASH_SOURCE[0]}")/gpu_engine_llama.sh" s20a
