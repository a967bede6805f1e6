#!/usr/bin/env bash
# Session 13's first device call (about 8 minutes): the decode kernel with rotary + KV write
# inside (decode_rotary_attention) on the GPU: kernel tests, all gpu tests, then the A/B of
# bench/ab_decode.py at batch 1 x 128 (Llama, Qwen) and batch 256 x 1k (Llama). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_rotary_attention.py \
    tests/kernels/test_decode_attention.py tests/kernels/test_rotary_write_kv.py tests/kernels/test_kv_quant.py 2>&1 | tail -3
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -4
d=$(date -u +%F)
python3 bench/ab_decode.py --out "$OUT/ab-decode-rope-h200-$d-s13.json" --rounds 3 2>&1 | grep -v Warn
python3 bench/ab_decode.py --out "$OUT/ab-decode-qwen-rope-h200-$d-s13.json" --model qwen2.5-7b --rounds 3 2>&1 | grep -v Warn
python3 bench/ab_decode.py --out "$OUT/ab-decode-bs256-rope-h200-$d-s13.json" --batch 256 --ctx 1024 --rounds 2 \
    --iters 30 2>&1 | grep -v Warn
