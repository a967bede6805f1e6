#!/usr/bin/env bash
# The default model on the GPU. Its 269 MB file cannot travel in one device call (64 MiB), so
# earlier calls of the same warm machine carry .m/meta and xz parts .m/smol.xz.00, .01, .02
# (made here with `xz -2` + `split -b 57400000 -d`); this call reassembles them, then runs the
# SmolLM2 gpu test, the n-gram benchmark on real text (bench/spec_decode.py, batch 1) and
# bench/kvquant.py with SMOLLM2_DIR (greedy fp8 agreement and n-gram keys on real weights).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-.}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
DIR=$PWD/.m/smollm2
mkdir -p "$DIR" && cp .m/meta/* "$DIR"/
python3 - "$DIR/model.safetensors" .m/smol.xz.0* <<'PY' || exit
import hashlib, lzma, sys
data = lzma.decompress(b"".join(open(p, "rb").read() for p in sorted(sys.argv[2:])))
open(sys.argv[1], "wb").write(data)
print("model.safetensors", len(data), "bytes, sha256", hashlib.sha256(data).hexdigest()[:16])
PY
export PDSERVE_SMOLLM2_DIR=$DIR SMOLLM2_DIR=$DIR
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_cuda.py -k smollm2 2>&1 | tail -4
timeout 200 python3 bench/spec_decode.py --device cuda --dtype bfloat16 --model "$DIR" --max-tokens 128 \
    --repeats 3 --out "$OUT/spec.json" 2>&1 | grep -E "speedup|acceptance|tok_s|equal|graphs" | head -12
timeout 200 python3 bench/kvquant.py --out "$OUT/kvquant_real.json" 2>&1 | tail -28
