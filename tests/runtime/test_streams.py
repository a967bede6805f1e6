"""The engine-thread -> event-loop bridges (pdserve.streams)."""

from __future__ import annotations

import asyncio
import threading

from pdserve.core.request import Finish
from pdserve.core.scheduler import TokenEvent
from pdserve.streams import StepStream


def test_step_stream_delivers_every_event_in_order_from_another_thread() -> None:
    async def main() -> list[TokenEvent]:
        stream = StepStream()
        sent = [TokenEvent(f"r{i % 7}", i, Finish.LENGTH if i == 999 else None) for i in range(1000)]

        def engine() -> None:
            for i, ev in enumerate(sent):
                stream.sink(ev)
                if i % 50 == 0:
                    threading.Event().wait(0.001)  # a step boundary now and then

        thread = threading.Thread(target=engine)
        thread.start()
        got: list[TokenEvent] = []
        batches = 0
        while len(got) < len(sent):
            got += await asyncio.wait_for(stream.next_batch(), 5)
            batches += 1
        thread.join()
        assert got == sent
        assert batches < len(sent)  # woken per burst, not per event
        return got

    asyncio.run(main())


def test_step_stream_waits_when_empty_and_wakes_on_a_later_event() -> None:
    async def main() -> None:
        stream = StepStream()
        waiter = asyncio.ensure_future(stream.next_batch())
        await asyncio.sleep(0.05)
        assert not waiter.done()
        threading.Thread(target=stream.sink, args=(TokenEvent("r", 5, None),)).start()
        assert [e.token for e in await asyncio.wait_for(waiter, 5)] == [5]

    asyncio.run(main())
