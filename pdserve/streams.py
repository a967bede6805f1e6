"""Bridge from the engine thread to asyncio: sinks that feed the event loop (per request, or batched)."""

from __future__ import annotations

import asyncio
import threading

from pdserve.core.scheduler import TokenEvent


class EventStream:
    """Token events of one request, pushed from the engine thread, read in the event loop."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

    def sink(self, event: TokenEvent) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    async def next_batch(self) -> list[TokenEvent]:
        """At least one event, plus every other one already waiting."""
        events = [await self._queue.get()]
        while not self._queue.empty():
            events.append(self._queue.get_nowait())
        return events


class StepStream:
    """Token events of many requests (one subscriber), pushed from the engine thread and read
    in the event loop in batches: one loop wake-up per engine step, not one per token."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._events: list[TokenEvent] = []
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._wake_pending = False

    def sink(self, event: TokenEvent) -> None:
        with self._lock:
            self._events.append(event)
            if self._wake_pending:
                return
            self._wake_pending = True
        self._loop.call_soon_threadsafe(self._ready.set)

    async def next_batch(self) -> list[TokenEvent]:
        """Every event pushed since the last call (at least one), in push order."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            with self._lock:
                events, self._events = self._events, []
                self._wake_pending = False
            if events:
                return events
