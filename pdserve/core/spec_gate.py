"""Whole-batch speculation gate (pure Python): may this decode step carry drafts?

A verify step costs every sequence in the batch more than a decode step (1 + K positions of
attention and sampling for those that drafted, the verify graph for all). Speculation pays only
while the tokens it adds outweigh that, and two things decide it:

- acceptance: a verify step that accepted under a quarter of its drafts is a miss;
- cost: the step's seconds per emitted token, compared with plain decode steps of a batch of
  the same size (a power-of-two bucket). Medians of the last few steps of each kind are
  compared; a verify step while verify steps cost more per token than plain ones is a miss
  too, however much it accepted. (SmolLM2 at batch 32 on an H200: 72 % of drafts accepted
  and still 6 % slower than plain decoding, 2026-12-03: the small model's steps are
  launch-bound and a verify step is dearer than the tokens it saves.)

A miss pauses drafting for a number of steps that grows fourfold (1, 4, 16, 64, 256) while the
probes after each pause keep missing; a step above both bars halves the next pause. The cost
needs plain steps to compare with: a bucket drafts from its first step, its fourth step is
plain when it has no plain sample yet, and so is every 32nd step while drafting (a fresh
baseline: the batch's text and lengths drift).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

MIN_ACCEPTANCE = 0.25  # a verify step whose drafts were accepted less than this is a miss
MAX_PAUSE = 256  # steps
GROWTH = 4  # a miss multiplies the next pause by this
SAMPLES = 8  # step costs kept per kind and bucket; their medians are compared
MIN_SAMPLES = 3  # verify steps of a bucket before cost decides; then a first plain step
REFRESH = 32  # while drafting, every REFRESH-th step of a bucket is plain


@dataclass
class _Bucket:
    """Recent seconds per emitted token of plain and verify steps of one batch-size bucket."""

    plain: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    verify: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    since_plain: int = 0  # drafting steps since the last plain one

    def verify_dearer(self) -> bool:
        """Verify steps cost more per token than plain ones (False until both are known)."""
        if len(self.verify) < MIN_SAMPLES or not self.plain:
            return False
        return statistics.median(self.verify) > statistics.median(self.plain)


@dataclass
class _Step:
    start: float
    batch: int
    proposed: int = 0
    accepted: int = 0


class BatchGate:
    """Speculation on or off for a whole step (module doc). Per step: allow(batch) before it,
    record(proposed, accepted) with its verify results; the next allow() closes it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pause = 0
        self._next_pause = 1
        self._buckets: dict[int, _Bucket] = {}
        self._step: _Step | None = None

    def allow(self, batch: int) -> bool:
        """Called once per step with the number of sequences decoding in it: may it draft?"""
        now = self._clock()
        if self._step is not None:
            self._close(self._step, now)
        bucket = self._bucket(batch)
        if self._pause > 0:
            self._pause -= 1
            drafting = False
        else:
            drafting = bucket.since_plain < (REFRESH - 1 if bucket.plain else MIN_SAMPLES)
        bucket.since_plain = bucket.since_plain + 1 if drafting else 0
        self._step = _Step(now, batch)
        return drafting

    def record(self, proposed: int, accepted: int) -> None:
        """Verify results of the current step (may be called once per sequence or as totals)."""
        if self._step is not None:
            self._step.proposed += proposed
            self._step.accepted += accepted

    def _close(self, step: _Step, now: float) -> None:
        if step.batch <= 0:
            return
        bucket = self._bucket(step.batch)
        per_token = (now - step.start) / (step.batch + step.accepted)
        if step.proposed == 0:  # nothing was drafted: the step was a plain one
            bucket.plain.append(per_token)
            return
        bucket.verify.append(per_token)
        if step.accepted >= MIN_ACCEPTANCE * step.proposed and not bucket.verify_dearer():
            self._next_pause = max(1, self._next_pause // 2)  # halved, not reset: one lucky
            return  # probe does not undo the back-off
        self._pause = self._next_pause
        self._next_pause = min(GROWTH * self._next_pause, MAX_PAUSE)

    def _bucket(self, batch: int) -> _Bucket:
        key = 1 << max(batch - 1, 0).bit_length()  # next power of two
        if key not in self._buckets:
            self._buckets[key] = _Bucket()
        return self._buckets[key]
