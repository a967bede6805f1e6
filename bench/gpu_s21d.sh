#!/usr/bin/env bash
# Session 21's last call, on whichever one-GPU machine comes: the decode kernel's compute floor
# (gpu_s21c.sh), then on an H200 the issue-9 loop figure (gpu_s21b.sh).
here="$(dirname "${BASH_SOURCE[0]}")"
bash "$here/gpu_s21c.sh"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q -i h200; then
    bash "$here/gpu_s21b.sh"
fi
