"""Device timing shared by the bench probes."""

from __future__ import annotations

import statistics

import torch


def event_ms(fn, reps: int = 20) -> float:
    """Median device milliseconds of fn (CUDA events around each call, after 3 warm-ups)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
