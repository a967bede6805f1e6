#!/usr/bin/env bash
# Session 27's first call, on an H200 (needs_h200): the issue-9 figure (gpu_s22d.sh short, ~200 s),
# then issue 3's batch-1 and batch-256 figures (gpu_engine_llama.sh, ~330 s).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
bash bench/gpu_s22d.sh short
bash bench/gpu_engine_llama.sh s27
exit 0
