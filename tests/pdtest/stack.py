"""Helpers for tests that run the real services as processes on loopback."""

from __future__ import annotations

import grpc

from pdserve.proto import worker_pb2, worker_pb2_grpc


def pool_stats(address: str, role: str) -> worker_pb2.WorkerStats:
    """GetStats of a worker; role is its Stack name: prefill[N], decode[N] or colocated."""
    stub_cls = worker_pb2_grpc.PrefillWorkerStub if role.startswith("prefill") else worker_pb2_grpc.DecodeWorkerStub
    with grpc.insecure_channel(address) as ch:
        return stub_cls(ch).GetStats(worker_pb2.StatsRequest(), timeout=10)


def assert_no_leaks(stack, timeout: float = 5.0) -> None:
    """The leak check: every worker's free blocks equal its total blocks (within timeout)."""
    import time

    deadline = time.monotonic() + timeout
    for role, address in stack.workers.items():
        if stack.procs[role].popen.poll() is not None:
            continue  # a worker the test killed
        while True:
            s = pool_stats(address, role)
            if s.free_blocks == s.total_blocks and s.running == 0 and s.waiting == 0:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{role} leaked: free {s.free_blocks}/{s.total_blocks}, "
                                     f"running {s.running}, waiting {s.waiting}")
            time.sleep(0.05)


def openai_client(stack, url: str):
    """An OpenAI SDK client of the stack's HTTP face (no retries); yields it, then closes it
    and checks the stack leaked nothing (a pytest fixture's body)."""
    import openai

    c = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    yield c
    c.close()
    assert_no_leaks(stack)
