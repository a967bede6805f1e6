"""The engine loop: one thread that runs schedule -> execute -> update, step after step.

RPC handlers never touch the scheduler directly: they call `submit`, `abort` and `locked`,
which take the loop's lock, and receive their tokens through the sink they handed in.

With `overlap` (and a runner that can `launch`), the host plans and queues step N+1 while the
device still runs step N, then applies N's tokens: the device never waits for the scheduler,
the staging of inputs or the sinks. Step N+1's tokens for sequences N ends are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pdserve.core.request import Finish, Sequence
from pdserve.core.scheduler import Scheduler, TokenEvent
from pdserve.core.step_io import StepInput, StepOutput
from pdserve.runtime.step_trace import StepTracer

log = logging.getLogger(__name__)

Sink = Callable[[TokenEvent], None]
LayerHook = Callable[[int], None]


class Runner(Protocol):
    def execute(self, step: StepInput, layer_hook: LayerHook | None = None) -> StepOutput: ...


class Launched(Protocol):
    """A queued step. One with `needs_masks` set (ModelRunner's PendingSampling) samples only
    once `give_masks` hands it the masks of its guided slices (Scheduler.pending_masks)."""

    def result(self) -> StepOutput: ...


@dataclass
class _Started:
    """A step handed to the runner: `result` gives its output (None: it failed to start)."""

    step: StepInput
    t0: float
    result: Callable[[], StepOutput] | None
    queued: bool  # still running on the device: the next step may be planned meanwhile
    launched: Launched | None = None


class EngineLoop:
    """Drives one scheduler and one runner on a dedicated thread."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        hook_for_step: Callable[[StepInput], LayerHook | None] | None = None,
        overlap: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self._hook_for_step = hook_for_step
        self._launch: Callable[[StepInput], Launched] | None = getattr(runner, "launch", None) if overlap else None
        self._last_end = 0.0
        self._sinks: dict[str, Sink] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.steps = 0
        self.busy_seconds = 0.0
        self.step_tracer: StepTracer | None = None  # set by a worker while tracing is on

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=10)

    @property
    def lock(self) -> threading.Lock:
        """Held while reading or changing scheduler state from another thread."""
        return self._lock

    def submit(self, seq: Sequence, sink: Sink) -> None:
        with self._wake:
            self.scheduler.add(seq)
            self._sinks[seq.request_id] = sink
            if self.step_tracer is not None:
                self.step_tracer.submitted(seq.request_id)
            self._wake.notify()

    def abort(self, request_id: str) -> bool:
        """Stop a request; its sink gets an ABORT event (now or at the end of the running step)."""
        with self._wake:
            inflight = self.scheduler.in_step(request_id)
            found = self.scheduler.abort(request_id)
            sink = None if inflight else self._sinks.pop(request_id, None)
            if self.step_tracer is not None and not inflight:
                self.step_tracer.forget(request_id)
        if sink is not None:
            sink(TokenEvent(request_id, -1, Finish.ABORT))
        return found

    def _run(self) -> None:
        running: _Started | None = None  # queued on the device, not yet applied
        while True:
            with self._wake:
                if running is None:
                    while not self._stop and not self.scheduler.has_work:
                        self._wake.wait(timeout=1.0)
                    if self._stop:
                        return
                    step: StepInput | None = self.scheduler.schedule()
                else:
                    step = None if self._stop else self.scheduler.schedule_next()
            if running is None and step is not None and not step.seqs:
                time.sleep(0.001)  # nothing fits yet (blocks); let frees arrive
                continue
            started = self._start(step) if step is not None else None
            if running is not None:
                self._apply(running)
            if started is not None and getattr(started.launched, "needs_masks", False):
                self._give_masks(started)  # the guides have seen the step before: its tokens are in
            running = started
            if running is not None and not running.queued:
                self._apply(running)
                running = None

    def _step(self, step: StepInput) -> None:
        """One step start to finish, nothing overlapped (bench/tracing_cost.py times it)."""
        self._apply(self._start(step))

    def _start(self, step: StepInput) -> _Started:
        """Queue the step (overlap) or run it; a failure is kept for _apply to abort the batch."""
        t0 = time.perf_counter()
        try:
            hook = self._hook_for_step(step) if self._hook_for_step else None
            if self._launch is not None and hook is None:
                launched = self._launch(step)
                return _Started(step, t0, launched.result, True, launched)
            out = self.runner.execute(step, layer_hook=hook)
            return _Started(step, t0, lambda: out, False)
        except Exception:  # a failed forward must not kill the loop or leak the batch
            log.exception("step failed; aborting its %d sequences", len(step.seqs))
            return _Started(step, t0, None, False)

    def _give_masks(self, started: _Started) -> None:
        """Hand a step waiting for its guided slices' masks the masks (its sampling is queued);
        a failure fails the step, as a failed launch does."""
        masks: dict[str, bytes] = {}
        try:
            with self._lock:
                masks = self.scheduler.pending_masks(started.step)
        except Exception:  # the step fails (its sequences end aborted) but is still sampled:
            log.exception("masks of a step failed; aborting its %d sequences", len(started.step.seqs))
            started.result = None  # the runner launches nothing more until it is
        try:
            started.launched.give_masks(masks)  # type: ignore[union-attr]
        except Exception:
            log.exception("sampling a step failed; aborting its %d sequences", len(started.step.seqs))
            started.result = None

    def _apply(self, started: _Started) -> None:
        """Wait for a step's tokens, update the scheduler, feed the sinks."""
        step, t0, out = started.step, started.t0, None
        if started.result is not None:
            try:
                out = started.result()
            except Exception:
                log.exception("step failed; aborting its %d sequences", len(step.seqs))
        end = time.perf_counter()
        if self.step_tracer is not None:
            self.step_tracer.step(step, time.time_ns() - int((end - t0) * 1e9), time.time_ns(), out is not None)
        with self._lock:
            if out is None:
                self.scheduler.fail_step(step)
                out = StepOutput()
            events = self.scheduler.update(step, out)
            sinks = [(self._sinks.get(e.request_id), e) for e in events]
            for e in events:
                if e.finish is not None:
                    self._sinks.pop(e.request_id, None)
                    if self.step_tracer is not None:
                        self.step_tracer.forget(e.request_id)
        for sink, ev in sinks:
            if sink is not None:
                sink(ev)
        self.steps += 1
        self.busy_seconds += end - max(t0, self._last_end)  # overlapped steps count once
        self._last_end = end
