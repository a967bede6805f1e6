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


def test_added_is_pooled_gateway_minus_pooled_direct() -> None:
    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    from gateway_overhead import _pct, _without_samples, added

    def side(delays_ms: list[float], cpu: float) -> dict:
        s = np.asarray(delays_ms) / 1000.0
        return {"steady_delays_s": s, "token_delay_steady_ms": _pct(s), "cpu_us_per_token": {"gateway": cpu}}

    pairs = [{"direct": side([1.0, 1.0, 1.0, 9.0], 0.0), "gateway": side([2.0, 2.0, 2.5, 12.0], 200.0)},
             {"direct": side([1.0, 3.0, 3.0, 3.0], 0.0), "gateway": side([1.5, 4.0, 4.0, 4.0], 180.0)}]
    out = added(pairs)
    # pooled direct: 1,1,1,1,3,3,3,9 (median 2.0); pooled gateway: 1.5,2,2,2.5,4,4,4,12 (median 3.25)
    assert out["pooled"]["median"] == 3.25 - 2.0
    assert out["per_pair_median"] == [2.25 - 1.0, 4.0 - 3.0]
    assert out["gateway_cpu_us_per_token"] == [200.0, 180.0]
    assert out["direct_pooled_ms"]["count"] == 8 and out["pooled"]["p99"] > 0
    assert "steady_delays_s" not in str(_without_samples({"repeats": pairs}))


def test_fake_subscription_survives_ticks_queued_faster_than_it_sends() -> None:
    """Several ticks queued before the Subscribe stream sends (fast clock, busy loop): each message
    ends exactly the requests whose last token it carries, and an abort between a tick and its
    send does not break the stream (both once broke every request of the stream with KeyError)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from fake_workers import _FakeSub

    from pdserve.proto import worker_pb2

    async def main() -> None:
        sub = _FakeSub(slots=1, vocab=100)
        sub.add("a", 0, 2)
        sub.add("b", 0, 3)
        for k in range(4):
            sub.tick(k, float(k))
        items = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
        assert [(rids, ended) for _, rids, ended, _ in items] == [(["a", "b"], []), (["a", "b"], ["a"]), (["b"], ["b"])]
        last = {b.request_id: b.finish for b in items[1][0].batches}
        assert last == {"a": worker_pb2.WORKER_FINISH_LENGTH, "b": worker_pb2.WORKER_FINISH_NONE}
        assert not sub.left and not sub.slot
        sub.add("c", 0, 5)
        sub.tick(9, 9.0)
        assert sub.remove("c") and not sub.remove("c")  # aborted after its tick was queued

    asyncio.run(main())
