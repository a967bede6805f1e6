# Sourced by the bench/gpu_*.sh device scripts: cd to the repo root, install the carried wheels
# (.whl, see ../shared/tools/device-wheels.sh) into /tmp/site, set PYTHONPATH and OUT.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
OUT="${OUT:-.}"
if ls .whl/*.whl >/dev/null 2>&1; then
    if [ ! -f /tmp/site/.pdserve-wheels ]; then  # once per machine: the scripts of a call share it
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl && touch /tmp/site/.pdserve-wheels || exit
    fi
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
# The results' commit (pdserve.bench.provenance): the device copy's .git may be stale, so write
# it here first and carry it: `git rev-parse --short HEAD > .commit`, carry [".commit", ...].
if [ -z "${PDSERVE_COMMIT:-}" ] && [ -f .commit ]; then
    export PDSERVE_COMMIT="$(cat .commit)"
fi
unset TRITON_INTERPRET
