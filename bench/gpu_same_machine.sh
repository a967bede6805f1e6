#!/bin/bash
# Decode figures of an older commit and of this tree on one machine, in one device call, so the
# spread between device sessions (up to 10 %) cannot pass for a regression or a gain.
#   here:   rm -rf .old && mkdir .old && git archive <old-commit> pdserve bench | tar -x -C .old
#   device: carry [".whl", ".old"]; bash bench/gpu_same_machine.sh <old-commit> <this-commit>
# Writes $OUT/engine-old.json and $OUT/engine-new.json (decode section, Llama-3.1-8B), alternating
# old, new, old, new so drift hits both alike.
source "$(dirname "$0")/gpu_env.sh"
[ -d .old/pdserve ] || { echo "no .old/pdserve: see the header"; exit 2; }
for round in 1 2; do
    (cd .old && PYTHONPATH=/tmp/site:$PWD python3 bench/engine.py --out "$OUT/engine-old-$round.json" \
        --sections decode --models llama-3.1-8b --commit "$1") 2>&1 | grep -A1 '"decode_bs1_tok_s\|replay_only\|"256"'
    python3 bench/engine.py --out "$OUT/engine-new-$round.json" --sections decode --models llama-3.1-8b \
        --commit "$2" 2>&1 | grep -A1 '"decode_bs1_tok_s\|replay_only\|"256"'
done
