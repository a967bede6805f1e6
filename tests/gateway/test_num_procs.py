"""`pdserve gateway --num-procs N`: real processes on loopback (the gateway in front of the fake
workers of bench/fake_workers.py, which emit one token per stream every 20 ms)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pdserve.client import AsyncClient, build_request
from pdserve.launch import Proc, free_port
from pdserve.proto import gateway_pb2

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 49152  # the fake's default --vocab-size: token id = tick % VOCAB
MAX_TOKENS = 30


@pytest.fixture
def fake_stack():
    sys.path.insert(0, str(ROOT / "bench"))
    from fake_stack import FakeStack

    return FakeStack


def _children(gw: Proc) -> dict[int, int]:
    """index -> pid of the gateway's children, from the parent's log."""
    found = (re.search(r"gateway process (\d+)/\d+: pid (\d+)", line) for line in gw.lines)
    return {int(m[1]): int(m[2]) for m in found if m}


def _served(gw: Proc) -> dict[int, int]:
    """index -> requests served, from each child's last log line."""
    found = (re.search(r"gateway process (\d+) \(pid \d+\) served (\d+) requests", line) for line in gw.lines)
    return {int(m[1]): int(m[2]) for m in found if m}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _e2e_count(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return float(re.search(r"^pdserve:e2e_request_latency_seconds_count (\S+)$", text, re.M)[1])


async def _streams(address: str, n: int, max_tokens: int, started: asyncio.Event | None = None,
                   connections: int = 24) -> list[tuple[list[int], gateway_pb2.Complete]]:
    """n concurrent streams over `connections` connections (the kernel spreads connections, not
    requests, over the gateway's processes); started is set when every stream has a token."""
    clients = [AsyncClient(address, own_connection=True) for _ in range(connections)]
    first: set[int] = set()

    async def one(i: int) -> tuple[list[int], gateway_pb2.Complete]:
        ids, done = [], gateway_pb2.Complete()
        req = build_request(token_ids=[1 + i, 2, 3], max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        async for msg in clients[i % connections].stream(req, timeout=60):
            if msg.HasField("chunk"):
                ids.extend(msg.chunk.token_ids)
                first.add(i)
                if started is not None and len(first) == n:
                    started.set()
            else:
                done = msg.complete
        return ids, done

    try:
        return list(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        for c in clients:
            await c.close()


def _check_complete(results: list[tuple[list[int], gateway_pb2.Complete]], max_tokens: int) -> None:
    for ids, done in results:
        assert len(ids) == max_tokens and done.usage.completion_tokens == max_tokens
        assert done.finish_reason == gateway_pb2.FINISH_REASON_LENGTH
        # one token per fake tick, in tick order (ids are tick % VOCAB)
        assert all(1 <= (b - a) % VOCAB < 1000 for a, b in zip(ids, ids[1:])), ids


@pytest.mark.slow
def test_two_procs_share_the_port_serve_all_streams_and_drain_on_sigterm(fake_stack):
    metrics_port, http_port = free_port(), free_port()
    args = ["--num-procs", "2", "--metrics-port", str(metrics_port), "--http-port", str(http_port),
            "--drain-timeout", "30"]
    with fake_stack(interval_ms=20, gateway_args=args) as stack:
        gw = stack.procs["gateway"]
        pids = _children(gw)
        assert sorted(pids) == [0, 1] and all(_alive(p) for p in pids.values())

        results = asyncio.run(_streams(stack.gateway, 48, 4))
        _check_complete(results, 4)
        counts = [_e2e_count(metrics_port), _e2e_count(metrics_port + 1)]  # child i on --metrics-port + i
        assert sum(counts) == 48 and min(counts) > 0, counts
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/models", timeout=10) as r:
            assert r.status == 200

        async def drained() -> list[tuple[list[int], gateway_pb2.Complete]]:
            started = asyncio.Event()
            task = asyncio.ensure_future(_streams(stack.gateway, 64, MAX_TOKENS, started))
            await asyncio.wait_for(started.wait(), 30)
            gw.popen.send_signal(signal.SIGTERM)  # every stream is mid-way (30 tokens x 20 ms)
            return await task

        results = asyncio.run(drained())
        _check_complete(results, MAX_TOKENS)
        assert gw.popen.wait(30) == 0
        served = _served(gw)
        assert sorted(served) == [0, 1] and sum(served.values()) == 48 + 64 and min(served.values()) > 0, served
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids.values()), "a gateway child outlived the gateway"


@pytest.mark.slow
def test_a_dying_child_stops_the_whole_gateway_with_a_clear_log_line(fake_stack):
    with fake_stack(interval_ms=20, gateway_args=["--num-procs", "2"]) as stack:
        gw = stack.procs["gateway"]
        pids = _children(gw)
        os.kill(pids[1], signal.SIGKILL)
        assert gw.popen.wait(30) == 1
        time.sleep(0.2)  # the pump thread reads the last lines
        assert any(f"gateway process 1 (pid {pids[1]}) exited with status -9; stopping the gateway" in line
                   for line in gw.lines), gw.lines[-10:]
        assert not _alive(pids[0])


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_num_procs_is_refused_naming_the_flag(value: str, capsys):
    from gateway.__main__ import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["--port", "1", "--num-procs", value])
    assert "--num-procs" in capsys.readouterr().err


def test_num_procs_needs_a_fixed_port():
    from gateway.__main__ import main

    with pytest.raises(SystemExit, match="--num-procs"):
        main(["--port", "0", "--num-procs", "2"])


def test_num_procs_refuses_a_taken_port():
    import socket

    from gateway import procs

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SystemExit, match=f"cannot bind 127.0.0.1:{port}"):
            procs.ensure_free("127.0.0.1", port)
