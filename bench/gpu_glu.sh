#!/bin/bash
# Session 9 call E (branch next/glu): gemv/fp8 kernel tests compiled, GPU tests, A/B of the
# SiLU-and-mul in the gate_up gemv (both models), fp8 vs bf16 decode steps at 256 x 4k.
source bench/gpu_env.sh
timeout 100 python3 -m pytest -q tests/kernels/test_gemv.py tests/kernels/test_kv_quant.py tests/kernels/test_decode_attention.py 2>&1 | tail -2
timeout 150 python3 -m pytest -q -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -3
timeout 80 python3 bench/ab_decode.py --out $OUT/ab.json --rounds 4 2>&1 | grep -v Warn
timeout 100 python3 -c "import sys,json; sys.path.insert(0,'bench'); import kvquant; d=kvquant.decode_speedup(); print(json.dumps(d)); json.dump(d, open('$OUT/kvquant_decode.json','w'))" 2>&1 | grep -v Warn | tail -2
timeout 60 python3 bench/ab_decode.py --model qwen2.5-7b --out $OUT/ab_qwen.json --rounds 3 2>&1 | grep -v Warn
