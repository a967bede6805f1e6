#!/usr/bin/env bash
# Session 27, one call for whichever GPU comes: the GPU tests of structured output (guided rows
# keep to their masks in graphs and eager) and of prompt logprobs' vocabulary ranks (not run on
# a GPU since 1fd56c3), then `bench/engine.py --sections guided` (Llama-3.1-8B shape, dummy
# weights): what structured output costs the engine loop besides llguidance; on an H200 also
# the issue-9 loop figure (gpu_s22d.sh short). Needs .whl carried (llguidance).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
d=$(date -u +%F)
g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_structured_output.py \
    tests/runtime/test_prompt_logprobs.py tests/runtime/test_sampler.py tests/runtime/test_overlap.py 2>&1 | tail -4
timeout 240 python3 bench/engine.py --models llama-3.1-8b --sections guided --out "$OUT/engine-guided-$g-$d-s27b.json" \
    2>&1 | grep -v Warn | tail -12
[ "$g" = h200 ] && bash bench/gpu_s22d.sh short
exit 0
