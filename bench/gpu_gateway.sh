#!/usr/bin/env bash
# One device call, CPU only (the GPU host has 16 cores): issue 8's gateway overhead "on 2 CPU
# cores" with the gateway pinned to cores 0-1 and the fake workers + client to cores 2-15, with
# 1 and 2 gateway processes; first an older checkout ($PREV, carried beside this tree), then this one.
# Needs a tokenizer-only model folder at .tok/smollm2-tokenizer (carried; no weights).
# Usage: PREV=.prev bash bench/gpu_gateway.sh   -> $OUT/gw-prev.json, $OUT/gw-cur.json
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
TOK=$PWD/.tok/smollm2-tokenizer
ARGS="--streams ${STREAMS:-500} --slots 25 --interval-ms 250 --output-len ${OUTPUT_LEN:-60} --connections 4
      --model $TOK --gateway-cpus ${GW_CPUS:-0,1} --harness-cpus ${HARNESS_CPUS:-2-15}"
run() {  # run SIDE DIR LABEL EXTRA...
    local side=$1 dir=$2 label=$3; shift 3
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout ${T_RUN:-200} python3 bench/gateway_overhead.py $ARGS "$@" \
        --label "$label" --out "$OUT/gw-$side.json" 2>&1 | grep -E "^(direct|gateway)" | cut -c1-220)
}
[ -n "${PREV:-}" ] && run prev "$PWD/$PREV" "prev" --num-procs 1,2 --repeat "${REPEAT:-2}" --errors-at 0
run cur "$PWD" "cur" --num-procs 1,2 --repeat "${REPEAT:-2}" --errors-at 1000
python3 - "$OUT"/gw-*.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    for run in json.load(open(f))["runs"]:
        for side in ("added_per_token_ms", "added_per_token_ms_gateway_procs2"):
            a = run.get(side, {})
            print(f.split("/")[-1], run.get("label"), side, "| pooled", a.get("pooled"), "| per pair",
                  a.get("per_pair_median"), "| gw cpu us/token", a.get("gateway_cpu_us_per_token"))
        print("  1000 streams:", {k: run.get("gateway_1000", {}).get(k) for k in ("errors", "completed")},
              "| met", run.get("met"))
PY
