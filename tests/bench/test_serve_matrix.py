"""bench/serve_matrix.py --smoke: tiny random config on CPU, every mode, 2 rates x 6 prompts (~35 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_smoke_matrix_writes_every_record(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "serve_matrix.py"), "--smoke", "--commit", "abc",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("serve-cpu-*.json")
    doc = json.loads(path.read_text())
    assert doc["commit"] == "abc" and doc["num_gpus"] == 1 and doc["shared_gpu"] is False
    assert "modes" in doc and not any("error" in m for m in doc["modes"].values())
    runs = doc["runs"]
    assert [(r["mode"], r["request_rate"]) for r in runs] == [
        (m, r) for m in ("disaggregated", "colocated", "transformers") for r in (8.0, "inf")]
    for r in runs:
        assert r["completed"] == 6 and r["failed"] == 0, r
        assert r["total_output_tokens"] >= 6 * 4
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            s = r[key]
            assert 0 < s["p50"] <= s["p90"] <= s["p99"], (r["mode"], key, s)
        assert 0 <= r["goodput"] <= r["request_throughput"] and r["output_throughput"] > 0
        assert r["ttft_ms"]["p50"] <= r["e2el_ms"]["p50"]
    assert "| inf | colocated |" in proc.stdout
