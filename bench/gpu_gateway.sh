#!/usr/bin/env bash
# One device call, CPU only (the GPU host has 16 cores): issue 8's gateway overhead "on 2 CPU
# cores" with the gateway pinned to cores 0-1 and the fake workers + client to cores 2-15,
# alternating rounds of an older checkout ($PREV, carried beside this tree) and this one.
# Needs a tokenizer-only model folder at .tok/smollm2-tokenizer (carried; no weights).
# Usage: PREV=.prev bash bench/gpu_gateway.sh   -> $OUT/gw-prev.json, $OUT/gw-cur.json
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
TOK=$PWD/.tok/smollm2-tokenizer
ARGS="--streams ${STREAMS:-500} --slots 25 --interval-ms 250 --output-len ${OUTPUT_LEN:-60} --connections 4
      --model $TOK --gateway-cpus 0,1 --harness-cpus 2-15"
run() {  # run SIDE DIR LABEL EXTRA...
    local side=$1 dir=$2 label=$3; shift 3
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 150 python3 bench/gateway_overhead.py $ARGS "$@" \
        --label "$label" --out "$OUT/gw-$side.json" 2>&1 | grep -E "^(direct|gateway)" | cut -c1-220)
}
for round in 1 2; do
    [ -n "${PREV:-}" ] && run prev "$PWD/$PREV" "prev round $round" --errors-at 0
    run cur "$PWD" "cur round $round" --errors-at "$([ $round = 2 ] && echo 1000 || echo 0)"
done
python3 - "$OUT"/gw-*.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    for run in json.load(open(f))["runs"]:
        a = run.get("added_per_token_ms", {})
        big = run.get("gateway_1000", {})
        print(f.split("/")[-1], run.get("label"), "| added pooled", a.get("pooled"), "| gw cpu us/token",
              a.get("gateway_cpu_us_per_token"), "| 1000 streams errors", big.get("errors"), "| met", run.get("met"))
PY
