#!/usr/bin/env bash
# Session 27: on an H200 the issue figures (gpu_s27.sh), on an H100 the structured-output tests
# and figures (gpu_s27b.sh).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash bench/gpu_s27.sh; else bash bench/gpu_s27b.sh; fi
