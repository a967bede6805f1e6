#!/usr/bin/env bash
# Kernel check on a CUDA machine: the kernel tests compiled for the GPU (no interpreter),
# then the kernel benchmarks. Run from the repository root; results go to $OUT (default .).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-.}"
unset TRITON_INTERPRET
export PYTHONPATH="${PWD}${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
python -m pytest -q tests/kernels -x -p no:cacheprovider
python bench/kernel_bench.py --out "$OUT/kernels.json"
