"""Metric definitions on hand-checkable synthetic timings."""

from __future__ import annotations

import pytest

from pdserve.bench.metrics import RequestOutput, compute, meets_slos, parse_goodput


def _outputs() -> list[RequestOutput]:
    a = RequestOutput(True, 10, 10, ttft=0.1, latency=1.0, itl=[0.1] * 9)  # TPOT 0.9 / 9 = 100 ms
    b = RequestOutput(True, 20, 5, ttft=0.3, latency=0.5, itl=[0.05] * 4)  # TPOT 0.2 / 4 = 50 ms
    c = RequestOutput(True, 30, 1, ttft=0.05, latency=0.05)  # one token: no TPOT sample, 0 for goodput
    d = RequestOutput(False, 40, 0, error="UNAVAILABLE")
    return [a, b, c, d]


def test_counts_and_throughput() -> None:
    m = compute(_outputs(), duration=2.0)
    assert (m["completed"], m["failed"]) == (3, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (60, 16)  # failed request not counted
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(8.0)
    assert m["total_token_throughput"] == pytest.approx(38.0)
    assert "request_goodput" not in m


def test_tpot_excludes_first_token_and_one_token_requests() -> None:
    out = _outputs()
    assert out[0].tpot == pytest.approx(0.1) and out[1].tpot == pytest.approx(0.05) and out[2].tpot == 0.0
    m = compute(out, duration=2.0)
    assert m["mean_tpot_ms"] == pytest.approx(75.0)  # (100 + 50) / 2: c has no TPOT sample
    assert m["median_tpot_ms"] == pytest.approx(75.0)


def test_ttft_e2el_itl_percentiles() -> None:
    m = compute(_outputs(), duration=2.0)
    assert m["mean_ttft_ms"] == pytest.approx(150.0)
    assert m["median_ttft_ms"] == pytest.approx(100.0)
    assert m["p50_ttft_ms"] == pytest.approx(100.0)
    assert m["p90_ttft_ms"] == pytest.approx(260.0)  # linear: 100 + 0.8 * (300 - 100)
    assert m["mean_e2el_ms"] == pytest.approx((1000 + 500 + 50) / 3)
    assert m["median_itl_ms"] == pytest.approx(100.0)  # 9 gaps of 100 ms, 4 of 50 ms, pooled
    assert m["mean_itl_ms"] == pytest.approx((900 + 200) / 13)
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert m[f"p50_{name}_ms"] <= m[f"p90_{name}_ms"] <= m[f"p99_{name}_ms"]


@pytest.mark.parametrize("slos, good", [
    (["ttft:200", "tpot:80"], 1),    # a misses TPOT, b misses TTFT, c meets both
    (["ttft:301", "tpot:101"], 3),   # all three successful requests
    (["e2el:600"], 2),                # b and c
    (["ttft:10"], 0),
])
def test_goodput_counts_only_requests_meeting_every_slo(slos: list[str], good: int) -> None:
    m = compute(_outputs(), duration=2.0, slos_ms=parse_goodput(slos))
    assert m["request_goodput"] == pytest.approx(good / 2.0)


def test_failed_request_is_never_good() -> None:
    assert not meets_slos(_outputs()[3], {"ttft": 1e9})


@pytest.mark.parametrize("bad", ["ttft", "itl:5", "ttft:-1", "tpot:abc"])
def test_parse_goodput_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_goodput([bad])


def test_empty_run_is_zeros() -> None:
    m = compute([RequestOutput(False)], duration=1.0)
    assert m["completed"] == 0 and m["mean_ttft_ms"] == 0.0
