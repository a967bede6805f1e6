#!/usr/bin/env bash
# Device script prepared in session 11 for the next GPU session (one call, about 6 minutes):
# 1. the real fp8 kernel with K through Triton's convert (landed unmeasured) and the V^T
#    fp8-dots probe (decides whether to store fp8 V transposed; issue 9),
# 2. the gpu tests, 3. Llama decode + engine-loop figures (sampled loop after the pinned-mirror
# pair of 77cdd15). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
python3 bench/fp8_dot_probe.py --vt 2>&1 | tee "$OUT/fp8-vt-probe.log"
python3 bench/fp8_dot_probe.py --vmode 2>&1 | tee "$OUT/fp8-vmode-probe.log"
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kv_quant.py 2>&1 | tail -2  # runs on the GPU unmarked
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -4
python3 bench/engine.py --out "$OUT/engine-llama.json" --models llama-3.1-8b --sections decode,loop 2>&1 \
    | grep -E "decode_loop|decode_bs1_tok_s|copy" | head -20
python3 -c "import sys, json; sys.path.insert(0, 'bench'); import kvquant; print(json.dumps(kvquant.decode_loop_speedup()))" \
    2>&1 | tee "$OUT/kvquant-loop.json"
