#!/usr/bin/env bash
# Session 19: the shared-GPU disaggregated serve run with spans (as gpu_serve_spans.sh), once
# with the pdserve package from before this session's compile fix (old/, untracked, run from a
# copy of the tree in /tmp/before so the workers import it) and once with the fix; each with an
# empty Triton cache, as on a fresh machine. Results under $OUT/before, $OUT/after.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
spans() {
python3 - "$1"/serve-*.json <<'PY'
import json, sys
for mode, m in json.load(open(sys.argv[1]))["modes"].items():
    for name, s in sorted(m.get("span_ms", {}).items()):
        print(f"{mode:14s} {name:18s} n={s['count']:4d} p50 {s['p50_ms']:9.1f} p90 {s['p90_ms']:9.1f} ms")
PY
}
for v in ${VARIANTS:-before after}; do
    root=$PWD
    if [ "$v" = before ]; then
        rm -rf /tmp/before && mkdir -p /tmp/before && cp -r $(ls -A | grep -v -x -E "pdserve|old|.git") /tmp/before/ && cp -r old/pdserve /tmp/before/
        root=/tmp/before
    fi
    mkdir -p "$OUT/$v"
    export TRITON_CACHE_DIR=/tmp/triton-serve-$v; rm -rf "$TRITON_CACHE_DIR"
    echo "=== $v"
    (cd "$root" && PYTHONPATH=/tmp/site:$root timeout 260 python3 bench/serve_matrix.py --commit "$(cat "$OLDPWD/.commit" 2>/dev/null)-$v" \
        --out-dir "$OUT/$v" --budget-s 100 --modes disaggregated --kv-transfer cuda_ipc --rates 8,16 \
        --num-prompts 48 --num-warmups 4 --trace > "$OUT/$v/serve.log" 2>&1; echo "rc $?")
    grep "rate " "$OUT/$v/serve.log" | tail -4
    spans "$OUT/$v"
done
