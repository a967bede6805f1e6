# Sourced by device commands that need the real default model on the GPU machine, which cannot
# download it and takes at most 64 MiB a call: the GGUF travels in two halves, .m1/a in one call
# and .m2/b in the next while the machine is still warm (ignored files stay between calls):
#   split -b 49181216 -d SmolLM2-135M-Instruct.Q4_1.gguf p && mv p00 .m1/a && mv p01 .m2/b
# It builds .m0/SmolLM2-135M-Instruct once (needs the gguf wheel in .whl) and exports its path as
# PDSERVE_SMOLLM2_DIR (tests/runtime/test_cuda.py) and SMOLLM2_DIR (bench/kvquant.py).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
SMOL=$PWD/.m0/SmolLM2-135M-Instruct
if [ ! -f "$SMOL/.pdserve-complete" ]; then
    if [ -f .m1/a ] && [ -f .m2/b ]; then
        mkdir -p .m0 && cat .m1/a .m2/b > .m0/smol.gguf && rm -rf "$SMOL" \
            && python3 -c "import sys; from pathlib import Path; from pdserve.model.prepare import build_from_gguf; build_from_gguf(Path(sys.argv[1]), Path(sys.argv[2]))" .m0/smol.gguf "$SMOL" \
            && rm -f .m0/smol.gguf && echo "built $SMOL"
    else
        echo "gpu_smol.sh: the GGUF halves are not both here: $(ls .m1 .m2 2>&1 | tr '\n' ' ')"
    fi
fi
if [ -f "$SMOL/.pdserve-complete" ]; then
    export PDSERVE_SMOLLM2_DIR=$SMOL SMOLLM2_DIR=$SMOL
fi
