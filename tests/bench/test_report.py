"""Console table, JSON writing, and plots being optional."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from pdserve.bench import report
from pdserve.bench.main import parse_rates
from pdserve.bench.metrics import RequestOutput, compute


def _run() -> tuple[float, list[RequestOutput], dict]:
    outs = [RequestOutput(True, 8, 4, ttft=0.1, latency=0.4, itl=[0.1] * 3)]
    return 2.0, outs, compute(outs, 1.0, {"ttft": 200})


def test_table_has_every_section() -> None:
    text = report.table(_run()[2], math.inf, 8)
    for needle in ("Request goodput", "Mean TTFT (ms)", "P99 TPOT (ms)", "Median ITL (ms)", "P90 E2EL (ms)", "inf"):
        assert needle in text


def test_json_writes_inf_as_a_string(tmp_path: Path) -> None:
    report.save_json(tmp_path / "r.json", {"request_rate": math.inf, "runs": [{"x": 1.5}]})
    assert json.loads((tmp_path / "r.json").read_text()) == {"request_rate": "inf", "runs": [{"x": 1.5}]}


def test_plots_are_skipped_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    assert report.plot(tmp_path / "p", [_run()]) == []
    assert "matplotlib is not installed" in capsys.readouterr().out


def test_plots_when_matplotlib_is_there(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pngs = report.plot(tmp_path / "p", [_run(), (4.0, *_run()[1:])])
    assert [p.name for p in pngs] == ["p-cdf.png", "p-goodput.png"] and all(p.stat().st_size for p in pngs)


def test_parse_rates() -> None:
    assert parse_rates("1,2.5,inf") == [1.0, 2.5, math.inf]
    for bad in ("", "0", "-1", "nan"):
        with pytest.raises(ValueError):
            parse_rates(bad)
