"""Bridge from the engine thread to asyncio: a sink that feeds an asyncio.Queue."""

from __future__ import annotations

import asyncio

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
