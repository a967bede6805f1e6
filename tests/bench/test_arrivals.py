"""Arrival gaps: Poisson / gamma statistics with a seed, and the pacing of sends."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from pdserve.bench.arrivals import intervals, paced


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_mean_gap_is_one_over_rate_and_cv_follows_burstiness(burstiness: float) -> None:
    gaps = intervals(40000, request_rate=4.0, burstiness=burstiness, seed=7)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    # gamma with shape k: coefficient of variation 1/sqrt(k); 1 for Poisson (exponential gaps)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_seeded_and_reproducible() -> None:
    assert np.array_equal(intervals(100, 2.0, 1.0, seed=3), intervals(100, 2.0, 1.0, seed=3))
    assert not np.array_equal(intervals(100, 2.0, 1.0, seed=3), intervals(100, 2.0, 1.0, seed=4))


def test_infinite_rate_sends_all_at_once() -> None:
    assert not intervals(50, math.inf).any()


@pytest.mark.parametrize("rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_rejects_bad_parameters(rate: float, burstiness: float) -> None:
    with pytest.raises(ValueError):
        intervals(10, rate, burstiness)


def test_paced_follows_the_schedule() -> None:
    async def go() -> list[float]:
        t0, seen = time.perf_counter(), []
        async for _ in paced(range(4), np.array([0.0, 0.05, 0.05, 0.1])):
            seen.append(time.perf_counter() - t0)
        return seen

    seen = asyncio.run(go())
    for got, due in zip(seen, [0.0, 0.05, 0.1, 0.2]):
        assert due - 0.002 <= got <= due + 0.1
