#!/usr/bin/env bash
# Device script: Nsight Compute full set on the paged decode attention kernel (fp8 and bf16
# pools, 256 x 4k, Llama-3.1-8B heads), summed by SASS opcode (bench/ncu_sass.py).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
which ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null
NCU=$(which ncu 2>/dev/null || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for kind in ${KINDS:-fp8 bf16}; do
    echo "== $kind"
    $NCU --kernel-name regex:_decode_kernel --launch-skip 2 --launch-count 1 --set full \
        --import-source no -f -o "$OUT/ncu-$kind" python3 bench/ncu_attention.py "$kind" > "$OUT/ncu-$kind.log" 2>&1 || tail -20 "$OUT/ncu-$kind.log"
    $NCU --import "$OUT/ncu-$kind.ncu-rep" --page details > "$OUT/ncu-$kind-details.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Compute \(SM\) Th|Issued Ipc|Executed Ipc A|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Shared Memory Per Block|L1/TEX Hit|L2 Hit|Executed Instructions  |Issue Slots Busy|No Eligible|Active Warps Per" "$OUT/ncu-$kind-details.txt" | head -30
    $NCU --import "$OUT/ncu-$kind.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-$kind-sass.csv" 2>&1
    python3 bench/ncu_sass.py "$OUT/ncu-$kind-sass.csv" 2>&1 | head -${TOP:-75}
    rm -f "$OUT/ncu-$kind.ncu-rep"
done
