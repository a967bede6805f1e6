"""Sum Nsight Compute's per-SASS-instruction counters by opcode (diagnostic).

    ncu --set full --import-source no -o R ... ; ncu --import R.ncu-rep --page source --csv \
        --print-source sass > R.csv ; python bench/ncu_sass.py R.csv

Prints, per opcode, the instructions executed (warp level) and the warp-stall samples, then
the SASS lines with the most stall samples and their top stall reasons.
"""

from __future__ import annotations

import csv
import sys
from collections import Counter


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path: str, top: int = 30) -> None:
    with open(path, newline="") as f:
        lines = [line for line in f if line.strip()]
    start = next(i for i, line in enumerate(lines) if "Source" in line and "," in line)
    rows = list(csv.DictReader(lines[start:]))
    cols = list(rows[0].keys())
    samp = next(c for c in cols if "Sampling (All" in c)
    execd = next((c for c in cols if c.startswith("Instructions Executed")), None)
    stall_cols = [c for c in cols if c.startswith("stall_") or "Stall" in c and c != samp][:40]
    by_op, by_op_exec = Counter(), Counter()
    for r in rows:
        op = r["Source"].split()[0] if r["Source"].split() else "?"
        if op.startswith("@"):
            op = r["Source"].split()[1]
        op = op.split(".")[0]
        by_op[op] += _num(r[samp])
        if execd:
            by_op_exec[op] += _num(r[execd])
    tot, tot_e = sum(by_op.values()) or 1, sum(by_op_exec.values()) or 1
    print(f"columns: {len(cols)}; samples {tot:.0f}; executed {tot_e:.0f}")
    for op, s in by_op.most_common(top):
        print(f"{op:12s} samples {100 * s / tot:5.1f}%  executed {100 * by_op_exec[op] / tot_e:5.1f}%")
    print("-- hottest lines")
    for r in sorted(rows, key=lambda r: -_num(r[samp]))[:top]:
        reasons = sorted(((_num(r[c]), c) for c in stall_cols), reverse=True)[:3]
        why = ", ".join(f"{c}={v:.0f}" for v, c in reasons if v > 0)
        print(f"{_num(r[samp]):7.0f} {r['Source'][:70]:70s} {why}")


if __name__ == "__main__":
    main(sys.argv[1])
