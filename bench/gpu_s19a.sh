#!/usr/bin/env bash
# Session 19: how often a fresh prefill worker's forward waits for Triton to compile
# (bench/jit_variants.py), each run with an empty Triton cache: the code before this session's
# fix (its pdserve package exported to old/, untracked), the fix (aligned uploads, batch-varying
# ints unspecialized), the fix with ModelRunner.warm_up() first. Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
run() {  # name, pythonpath, args...
    local name=$1 pp=$2; shift 2
    export TRITON_CACHE_DIR=/tmp/triton-$name; rm -rf "$TRITON_CACHE_DIR"
    echo "=== $name"
    PYTHONPATH=$pp timeout 150 python3 bench/jit_variants.py --out "$OUT/jit-variants-$g-$d-s19a-$name.json" "$@" \
        2>&1 | grep -v Warn | tail -42 | cut -c1-200
}
[ -d old/pdserve ] && run before "/tmp/site:$PWD/old:$PWD"
run fixed "/tmp/site:$PWD"
run fixed-warm "/tmp/site:$PWD" --warm
echo "=== kernel tests (compiled)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_specialization.py \
    tests/kernels/test_decode_attention.py tests/kernels/test_prefill_attention.py 2>&1 | tail -2
