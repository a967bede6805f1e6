"""Request arrival times: Poisson (burstiness 1) or gamma-distributed gaps, as vLLM defines them."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def intervals(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Gaps (seconds) before each of n requests.

    Gamma with shape `burstiness` and scale 1/(rate*burstiness): the mean gap is 1/rate for any
    burstiness; burstiness 1 is a Poisson process, < 1 burstier, > 1 more uniform. An infinite
    rate sends everything at once (all gaps 0).
    """
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if request_rate <= 0:
        raise ValueError(f"request rate must be > 0, got {request_rate}")
    if math.isinf(request_rate):
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    theta = 1.0 / (request_rate * burstiness)
    return rng.gamma(shape=burstiness, scale=theta, size=n)


async def paced(items: Sequence[T], gaps: np.ndarray) -> AsyncIterator[T]:
    """Yields items[i] after sleeping gaps[i]; the schedule is absolute, so delays do not accumulate."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    due = 0.0
    for item, gap in zip(items, gaps):
        due += float(gap)
        wait = start + due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        yield item
