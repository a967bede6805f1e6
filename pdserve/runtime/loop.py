"""The engine loop: one thread that runs schedule -> execute -> update, step after step.

RPC handlers never touch the scheduler directly: they call `submit`, `abort` and `locked`,
which take the loop's lock, and receive their tokens through the sink they handed in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
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


class EngineLoop:
    """Drives one scheduler and one runner on a dedicated thread."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        hook_for_step: Callable[[StepInput], LayerHook | None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self._hook_for_step = hook_for_step
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
        while True:
            with self._wake:
                while not self._stop and not self.scheduler.has_work:
                    self._wake.wait(timeout=1.0)
                if self._stop:
                    return
                step = self.scheduler.schedule()
            if not step.seqs:
                time.sleep(0.001)  # nothing fits yet (blocks); let frees arrive
                continue
            self._step(step)

    def _step(self, step: StepInput) -> None:
        t0 = time.perf_counter()
        hook = self._hook_for_step(step) if self._hook_for_step else None
        try:
            out = self.runner.execute(step, layer_hook=hook)
        except Exception:  # a failed forward must not kill the loop or leak the batch
            log.exception("step failed; aborting its %d sequences", len(step.seqs))
            out = None
        if self.step_tracer is not None:
            self.step_tracer.step(step, time.time_ns() - int((time.perf_counter() - t0) * 1e9), time.time_ns(),
                                  out is not None)
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
        self.busy_seconds += time.perf_counter() - t0
