#!/usr/bin/env bash
# Session 14's H200 call: every gpu-marked test at HEAD, then on the same GPU the sampler bench
# (gpu_s14b.sh), the Llama engine-loop figures (greedy and sampled) and the layer-draft
# speculation run (gpu_s14c.sh). Results under $OUT, named by the GPU.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
python3 -m pytest -q -p no:cacheprovider -rfs -m gpu tests/ 2>&1 | grep -E "passed|failed|Error|assert|SKIP" | head -20
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
python3 bench/sampler.py --out "$OUT/sampler-$g-$d-s14d.json" 2>&1 | grep -v Warn | grep -v fastest
python3 bench/engine.py --out "$OUT/engine-$g-$d-s14d-llama.json" --models llama-3.1-8b --sections loop 2>&1 \
    | grep -A7 "sampled\|decode_loop_tok" | head -40
mkdir -p /tmp/llama8b && cp bench/configs/llama-3.1-8b.json /tmp/llama8b/config.json
python3 bench/spec_decode.py --device cuda --dtype bfloat16 --load-format dummy --model /tmp/llama8b \
    --speculative-config '{"model": "(first layers)", "num_speculative_tokens": 4}' \
    --draft-layers 2 --draft-noise 0,0.1,0.2,0.3,1 --max-tokens 128 --out "$OUT/spec-draft-$g-$d-s14d.json" >/dev/null 2>&1
python3 - "$OUT/spec-draft-$g-$d-s14d.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in d["by_noise"].items():
    print("noise", k, "plain", v["plain_decode_tok_s"], "spec", v["draft_model_decode_tok_s"], "speedup", v["speedup"],
          "acceptance", v["acceptance_rate"], "equal", v["greedy_tokens_equal"])
PY
