#!/usr/bin/env bash
# Device script (2026-12-04): the fp8-query decode kernel: kernel tests on the GPU, the real
# kernel with qk8 off/on, then kvquant's eager-step and engine-loop fp8/bf16 decode speedups.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kv_quant.py 2>&1 | tail -2
python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 | tail -2
python3 bench/fp8_dot_probe.py --real 2>&1 | tee "$OUT/fp8-dot-probe.log"
python3 - <<'PY' 2>&1 | tee "$OUT/kvquant-decode.json"
import json, sys
sys.path.insert(0, "bench")
import kvquant
from pdserve.bench.provenance import source_commit
r = {"gpu": "NVIDIA H200", "commit": source_commit(), "command": "bench/gpu_qk8.sh"}
r |= kvquant.decode_speedup()
print(json.dumps(r), flush=True, file=sys.stderr)
r |= kvquant.decode_loop_speedup()
print(json.dumps(r))
PY
