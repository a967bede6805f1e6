#!/usr/bin/env bash
# One device call: CUDA runtime + CUDA-graph tests, then the engine benchmark (JSON to $OUT/engine.json).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-.}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_cuda_graph.py tests/runtime/test_cuda.py tests/e2e/test_gpu_stack.py > $OUT/gpu_tests.log 2>&1
timeout "${ENGINE_TIMEOUT:-300}" python3 bench/engine.py --out "$OUT/engine.json" ${ENGINE_ARGS:-} > $OUT/engine.log 2>&1
echo "== engine rc $? (log tail)"; grep -v Warning $OUT/engine.log | tail -8
echo "== tests"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.log | tail -25
python3 - "$OUT/engine.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("copy", round(d["copy_GBps"]), "GB/s  matmul", round(d["matmul_TFLOPs"]), "TFLOP/s")
for name, m in d["models"].items():
    print(name, "bs1", {k: (round(v["tok_s"], 1), round(v["roofline_ratio"], 3)) for k, v in m["decode_bs1_by_ctx"].items()},
          "replay-only", {k: round(v, 3) for k, v in m.get("decode_bs1_replay_only", {}).items()})
    print("  by batch", {k: round(v) for k, v in m["decode_tok_s_by_batch"].items()},
          "cpu_ovh_bs256", round(m["step_cpu_overhead_ratio_bs256"], 3))
    print("  prefill", {k: round(v) for k, v in m["prefill_tok_s"].items()}, "hf", m["hf_generate_tok_s"])
PY
