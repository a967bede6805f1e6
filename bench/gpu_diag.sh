#!/usr/bin/env bash
# One device call (one GPU): every gpu-marked test, then the cuda_ipc transfer benchmark, KV
# quantization, a decode-step kernel profile and the kernel micro-benchmarks; files to $OUT.
# Usage on the GPU machine: bash bench/gpu_diag.sh   (each part has its own time limit)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
part() {  # part NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log, print its tail
    local name=$1 secs=$2; shift 2
    [ "$secs" = 0 ] && return  # a limit of 0 skips the part
    local t0=$SECONDS
    timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name rc $? in $((SECONDS - t0)) s"
    grep -v -i warn "$OUT/$name.log" | tail -"${TAIL:-25}"
}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
TAIL=25 part transfer "${T_TRANSFER:-170}" python3 bench/transfer.py --backends cuda_ipc --reps 3 --out "$OUT/transfer.json"
TAIL=12 part gpu_tests "${T_TESTS:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider --ignore=tests/e2e/test_openai_http.py ${TESTS:-tests}
# tests/kernels are not gpu-marked (they run on CUDA when it is there): name them, or -m gpu drops them
TAIL=6 part kernel_tests "${T_KTESTS:-150}" python3 -m pytest -q -p no:cacheprovider tests/kernels
TAIL=20 part kvquant "${T_KVQ:-90}" python3 bench/kvquant.py --out "$OUT/kvquant.json"
TAIL=40 part profile "${T_PROF:-80}" python3 bench/profile_decode.py --out "$OUT/profile.json"
TAIL=14 part kernels "${T_KERN:-50}" python3 bench/kernel_bench.py --out "$OUT/kernels.json"
