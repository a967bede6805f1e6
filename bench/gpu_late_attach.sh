#!/bin/bash
# Branch next/late-attach: TTFT of a layer-wise cuda_ipc transfer with the attach sent at
# start() (now) and with the first push, interleaved, 2k and 8k prompts, 15 reps.
source "$(dirname "$0")/gpu_env.sh"
python3 bench/transfer.py --out $OUT/transfer.json --backends cuda_ipc --tokens 8192 --ttft-tokens 2048,8192 \
    --reps 15 --late-attach 2>&1 | grep -v Warn | grep -i "ttft\|copy"
