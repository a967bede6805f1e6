#!/bin/bash
# Several branches' GPU checks in one device call (one cold start instead of one per branch).
#   here:   rm -rf .br && for b in next/a next/b; do
#             d=.br/${b#next/}; mkdir -p $d && git archive $b pdserve bench tests | tar -x -C $d; done
#   device: carry [".whl", ".br"]; bash bench/gpu_branches.sh a:gpu_a.sh b:gpu_b.sh
# (session 9 ran next/merge-last, next/fp8-dot, next/l2-prefetch and next/late-attach this way:
# bench/results/branches-h200-2026-12-04-s9.log)
# Each NAME:SCRIPT runs .br/NAME/bench/SCRIPT from .br/NAME (its own pdserve first on the path),
# its $OUT a subfolder NAME of this call's $OUT.
source "$(dirname "$0")/gpu_env.sh"
root=$PWD
for spec in "$@"; do
    name=${spec%%:*}; script=${spec#*:}
    [ -f ".br/$name/bench/$script" ] || { echo "== $name: no .br/$name/bench/$script"; continue; }
    echo "== $name ($script)"
    mkdir -p "$OUT/$name"
    (cd ".br/$name" && cp -n "$root/pyproject.toml" . 2>/dev/null; \
     ln -sfn "$root/.whl" .whl; OUT="$OUT/$name" bash "bench/$script") 2>&1 | grep -v Warn
done
