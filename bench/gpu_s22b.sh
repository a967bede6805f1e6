#!/usr/bin/env bash
# Session 22, after gpu_s22d.sh on an H200: issue 3's batch-1 and batch-256 targets.
bash "$(dirname "${BASH_SOURCE[0]}")/gpu_engine_llama.sh" s22b
