#!/usr/bin/env bash
# Device script, session 11 (2026-12-04). Needs the GGUF halves (bench/gpu_smol.sh) and the
# pre-session sampler in .old/sampler.py (for the mutation check of the no-sync tests).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_smol.sh"
echo "smol: ${SMOLLM2_DIR:-none}"
echo "== kvquant"
python3 bench/kvquant.py --out "$OUT/kvquant.json" > "$OUT/kvquant.log" 2>&1; tail -c 600 "$OUT/kvquant.log"
echo "== gpu tests"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --ignore=tests/e2e/test_openai_http.py 2>&1 | tail -4
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kv_quant.py tests/runtime/test_sampler.py 2>&1 | tail -2
if [ -f .old/sampler.py ]; then
    echo "== mutation: the session-10 sampler must fail the no-sync tests"
    cp pdserve/runtime/sampler.py /tmp/new_sampler.py && cp .old/sampler.py pdserve/runtime/sampler.py
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_sampler.py tests/runtime/test_overlap.py -k sync 2>&1 | tail -3
    cp /tmp/new_sampler.py pdserve/runtime/sampler.py
fi
echo "== sampled engine loop, Llama-3.1-8B shape"
python3 - <<'PY' 2>&1 | tee "$OUT/loop-sampled.json"
import json, sys
sys.path.insert(0, "bench")
import torch
import engine
from pdserve.bench.provenance import source_commit
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner
spec = ModelSpec.from_config_dict(json.loads((engine.CONFIGS / "llama-3.1-8b.json").read_text()))
nb = 256 * (1024 // engine.BS + 1 + engine.LOOP_STEPS // engine.BS + 1) + 64
r = ModelRunner(spec, None, device="cuda", dtype=torch.bfloat16, num_blocks=nb, block_size=engine.BS,
                load_format="dummy", max_model_len=8192 + 512, max_num_seqs=256)
r.kv_pool.normal_()
out = {"gpu": torch.cuda.get_device_name(), "commit": source_commit(), "command": "bench/gpu_s11.sh",
       "model": "llama-3.1-8b (dummy weights)", "context": 1024,
       "decode_loop_greedy_overlap_tok_s_by_batch": {str(b): engine.loop_decode(r, spec, b, 1024, True) for b in (1, 256)}}
out |= engine.sampled_loop_figures(r, spec)
print(json.dumps(out))
PY
