"""The instrument of bench/gateway_overhead.py: the fake decode worker's emit log, read through the
real gateway, gives one emit time per decode token, each before the client saw that token."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from pdserve.client import AsyncClient, build_request
from pdtest.stack import pool_stats

ROOT = Path(__file__).resolve().parents[2]


async def _generate(address: str, n: int, max_tokens: int) -> dict[str, list[float]]:
    """request id -> monotonic arrival time of each token, for n concurrent requests."""
    client = AsyncClient(address)

    async def one(i: int) -> tuple[str, list[float]]:
        seen, rid = [], ""
        req = build_request(token_ids=[1 + i, 2, 3], max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        async for msg in client.stream(req, timeout=30):
            if msg.HasField("chunk"):
                seen.extend([time.monotonic()] * len(msg.chunk.token_ids))
            else:
                rid = msg.complete.request_id
        return rid, seen

    try:
        return dict(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        await client.close()


def test_emit_log_pairs_every_decode_token_with_its_arrival(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from fake_stack import FakeStack
    from gateway_overhead import delays, read_emits

    log = tmp_path / "emits.txt"
    log.touch()
    with FakeStack(interval_ms=20, slots=2, emit_log=str(log)) as stack:
        arrivals = asyncio.run(_generate(stack.gateway, 4, 6))
        emits = asyncio.run(read_emits(log, set(arrivals)))
        assert pool_stats(stack.workers["fake-decode"], "decode").running == 0  # every decode stream closed
    assert len(arrivals) == 4 and all(len(seen) == 6 for seen in arrivals.values())
    assert set(emits) == set(arrivals) and all(len(e) == 5 for e in emits.values())  # the first token: prefill
    for e in emits.values():
        assert all(b - a > 0.015 for a, b in zip(e, e[1:]))  # one token per stream per 20 ms tick
    when, delay = delays(arrivals, emits)
    assert len(delay) == 20
    assert (delay > 0).all() and (delay < 5.0).all()  # seen after it was sent, same clock
