"""The gateway under load and failure, real processes on loopback (1 prefill + 2 decode workers):
200 concurrent streams, 100 random cancels, queue overflow, client timeouts, SIGTERM drain, and
kill -9 of a decode worker mid-stream (last: it leaves the stack with one decode worker)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import grpc
import pytest

from pdserve.client import AsyncClient, Client, build_request
from pdserve.launch import Stack
from pdtest.stack import assert_no_leaks

pytestmark = pytest.mark.slow

# Small prefill steps: an abort lands at the end of the step, and a 2048-token step takes
# seconds on two busy CPU cores.
WORKER = ["--max-model-len", "512", "--num-blocks", "400", "--max-num-batched-tokens", "256"]
PROMPTS = ["The quick brown fox", "def fibonacci(n):", "Once upon a time, in a land", "Paris is the capital of"]


@pytest.fixture(scope="module")
def stack(default_model_dir):
    with Stack(model=str(default_model_dir), worker_args=WORKER, gateway_args=["--max-model-len", "512"],
               decode_args=["--lease-ms", "3000"], num_decode=2) as st:
        yield st


def extra_gateway(stack: Stack, name: str, *args: str):
    """Another gateway process in front of the same workers."""
    pools = [f"--prefill={stack.workers['prefill']}", f"--decode={stack.workers['decode']},{stack.workers['decode2']}"]
    proc = stack.spawn(name, "gateway", [*pools, "--max-model-len", "512", *args])
    stack.wait([proc], 120)
    return proc


async def _tokens(client: AsyncClient, prompt: str, max_tokens: int) -> list[int]:
    return (await client.generate(text=prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                  timeout=180))[1]


def test_200_concurrent_streams_equal_sequential(stack):
    with Client(stack.gateway) as c:
        want = {p: c.generate(text=p, max_tokens=8, temperature=0.0, ignore_eos=True)[1] for p in PROMPTS}
    work = [PROMPTS[i % len(PROMPTS)] for i in range(200)]

    async def main() -> list[list[int]]:
        client = AsyncClient(stack.gateway)
        try:
            return list(await asyncio.gather(*(_tokens(client, p, 8) for p in work)))
        finally:
            await client.close()

    t0 = time.monotonic()
    got = asyncio.run(main())
    print(f"200 streams in {time.monotonic() - t0:.1f} s")
    assert [want[p] for p in work] == got
    assert_no_leaks(stack)


def test_100_random_cancels_free_every_block_within_2s(stack):
    rng = random.Random(7)

    async def one(client: AsyncClient, i: int) -> str:
        task = asyncio.ensure_future(client.generate(token_ids=[rng.randrange(100, 30000) for _ in range(5 + i % 90)],
                                                     max_tokens=24, temperature=0.0, ignore_eos=True, timeout=180))
        await asyncio.sleep(rng.uniform(0.0, 5.0))  # queued, prefilling, transferring or decoding
        if task.done():
            return "finished"
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "finished"

    async def main() -> list[str]:
        client = AsyncClient(stack.gateway)
        try:
            return list(await asyncio.gather(*(one(client, i) for i in range(100))))
        finally:
            await client.close()

    outcomes = asyncio.run(main())
    assert outcomes.count("cancelled") >= 30, outcomes
    assert_no_leaks(stack, timeout=2.0)


def test_client_timeout_gives_deadline_exceeded_and_frees_blocks(stack):
    with Client(stack.gateway) as c:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            c.generate(text="Tell me a long story", max_tokens=400, temperature=0.0, ignore_eos=True, timeout=1.0)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 3
    assert_no_leaks(stack, timeout=2.0)


def test_queue_overflow_is_refused_at_once_and_admitted_finish(stack):
    gw = extra_gateway(stack, "gateway-small", "--max-queued-requests", "3")

    async def one(client: AsyncClient, i: int):
        t0 = time.monotonic()
        try:
            return await client.generate(text=f"{i} " + PROMPTS[i % 4] * 20, max_tokens=4, temperature=0.0,
                                         ignore_eos=True, timeout=120)
        except grpc.aio.AioRpcError as e:
            return e, time.monotonic() - t0

    async def main() -> list:
        client = AsyncClient(gw.address)
        try:
            return list(await asyncio.gather(*(one(client, i) for i in range(16))))
        finally:
            await client.close()

    results = asyncio.run(main())
    refused = [r for r in results if isinstance(r[0], grpc.aio.AioRpcError)]
    done = [r for r in results if not isinstance(r[0], grpc.aio.AioRpcError)]
    assert refused and len(done) >= 3
    for e, seconds in refused:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and seconds < 1.0
        assert dict(e.trailing_metadata()).get("retry-after-ms")
    assert all(len(ids) == 4 for _, ids, _ in done)
    gw.stop()
    assert_no_leaks(stack)


def test_sigterm_drains_in_flight_and_refuses_new(stack):
    gw = extra_gateway(stack, "gateway-drain", "--drain-timeout", "30")
    with Client(gw.address) as c:
        call = c.stream(build_request(text="Count to fifty:", max_tokens=40, temperature=0.0, ignore_eos=True),
                        timeout=120)
        ids = list(next(call).chunk.token_ids)
        gw.popen.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as err:
            c.generate(text="Hello", max_tokens=2, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        for msg in call:
            ids.extend(msg.chunk.token_ids)
            if msg.HasField("complete"):
                assert msg.complete.usage.completion_tokens == 40
    assert len(ids) == 40
    assert gw.popen.wait(20) == 0
    assert_no_leaks(stack)


def test_kill_decode_worker_mid_stream(stack):
    """kill -9 one of two decode workers during 20 streams: its clients get UNAVAILABLE within 5 s."""
    killed_at = [0.0]

    async def one(client: AsyncClient, i: int, go: asyncio.Event, ready: list[int]):
        req = build_request(text=PROMPTS[i % 4] + f" {i}", max_tokens=80, temperature=0.0, ignore_eos=True)
        n = 0
        try:
            async for msg in client.stream(req, timeout=120):
                n += len(msg.chunk.token_ids)
                if n >= 2 and i not in ready:
                    ready.append(i)
                    if len(ready) == 20:
                        go.set()
            return "ok", n, time.monotonic()
        except grpc.aio.AioRpcError as e:
            return e.code(), n, time.monotonic()

    async def main() -> list:
        client, go, ready = AsyncClient(stack.gateway), asyncio.Event(), []
        try:
            tasks = [asyncio.ensure_future(one(client, i, go, ready)) for i in range(20)]
            await asyncio.wait_for(go.wait(), 60)
            os.kill(stack.procs["decode2"].popen.pid, signal.SIGKILL)
            killed_at[0] = time.monotonic()
            return list(await asyncio.wait_for(asyncio.gather(*tasks), 120))
        finally:
            await client.close()

    results = asyncio.run(main())
    failed = [r for r in results if r[0] != "ok"]
    assert failed and len(failed) < 20, results
    for code, n, at in failed:
        assert code == grpc.StatusCode.UNAVAILABLE and at - killed_at[0] < 5.0
    assert all(n == 80 for code, n, _ in results if code == "ok")
    stack.procs["decode2"].popen.wait()
    with Client(stack.gateway) as c:  # new requests go to the surviving worker
        for p in PROMPTS:
            t0 = time.monotonic()
            assert len(c.generate(text=p, max_tokens=4, temperature=0.0, ignore_eos=True, timeout=30)[1]) == 4
            assert time.monotonic() - t0 < 5
    assert_no_leaks(stack)
