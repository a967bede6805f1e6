#!/usr/bin/env bash
# Session 14's third device call: draft-model speculation timed at batch 1 on Llama-3.1-8B
# shapes with random weights and a draft of known quality (pdserve/bench/layer_draft.py: the
# target's first 2 layers; its later layers silenced, same cost per step), at five levels of
# noise on the draft's head (s14e: after one untimed repeat as warm-up). Results under $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
python3 -m pytest -q -p no:cacheprovider tests/bench/test_layer_draft.py tests/runtime/test_draft_model.py 2>&1 | tail -1
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
mkdir -p /tmp/llama8b && cp bench/configs/llama-3.1-8b.json /tmp/llama8b/config.json
python3 bench/spec_decode.py --device cuda --dtype bfloat16 --load-format dummy --model /tmp/llama8b \
    --speculative-config '{"model": "(first layers)", "num_speculative_tokens": 4}' \
    --draft-layers 2 --draft-noise 0,0.1,0.2,0.3,1 --max-tokens 128 --out "$OUT/spec-draft-$g-$d-s14e.json" 2>&1 \
    | grep -E "^(plain|spec) |Error|error" | head -60
python3 - "$OUT/spec-draft-$g-$d-s14e.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in d["by_noise"].items():
    print("noise", k, "plain", v["plain_decode_tok_s"], "spec", v["draft_model_decode_tok_s"], "speedup", v["speedup"],
          "acceptance", v["acceptance_rate"], "equal", v["greedy_tokens_equal"],
          "runs", [r["spec_tok_s"] for r in v["runs"]])
PY
