"""bench/tracing_cost.py on CPU with a tiny model: the three modes run and tracing really records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tracing_cost_runs_and_records_spans() -> None:
    steps, batch = 4, 3
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tracing_cost.py"), "--steps", str(steps),
                           "--batch", str(batch), "--context", "40"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)
    for key in ("bare_step_ms", "off_step_ms", "on_step_ms"):
        assert res[key] > 0, key
    assert res["off_over_bare"] == res["off_step_ms"] / res["bare_step_ms"]
    # every step (3 warm-up + steps) gives one forward span; each request one queue span; one root
    assert res["spans_exported"] == (steps + 3) + batch + 1, res
