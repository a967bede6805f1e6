#!/usr/bin/env bash
# Session 14's last device call: the draft model's K steps queued back to back (placeholders
# read on the device) against the one-execute-per-draft proposer before it, same machine, one
# after the other: the gpu tests of draft-model speculation, then bench/spec_decode.py's layer
# draft (gpu_s14c.sh) at three noise levels with each proposer (the old one from a carried copy,
# .old/draft_model.py = pdserve/runtime/draft_model.py at 5e8ac8d, copied over this machine's tree).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
python3 -m pytest -q -p no:cacheprovider -rf tests/bench/test_layer_draft.py tests/runtime/test_draft_model.py \
    tests/runtime/test_cuda_graph.py 2>&1 | tail -2
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
mkdir -p /tmp/llama8b && cp bench/configs/llama-3.1-8b.json /tmp/llama8b/config.json
for which in queued per-step; do
    [ "$which" = per-step ] && cp .old/draft_model.py pdserve/runtime/draft_model.py
    python3 bench/spec_decode.py --device cuda --dtype bfloat16 --load-format dummy --model /tmp/llama8b \
        --speculative-config '{"model": "(first layers)", "num_speculative_tokens": 4}' \
        --draft-layers 2 --draft-noise 0,0.1,1 --max-tokens 128 --out "$OUT/spec-draft-$which-$g-$d-s14f.json" \
        >/dev/null 2>&1
    python3 - "$OUT/spec-draft-$which-$g-$d-s14f.json" "$which" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in d["by_noise"].items():
    print(sys.argv[2], "noise", k, "plain", v["plain_decode_tok_s"], "spec", v["draft_model_decode_tok_s"],
          "speedup", v["speedup"], "acceptance", v["acceptance_rate"], "runs", [r["spec_tok_s"] for r in v["runs"]])
PY
done
