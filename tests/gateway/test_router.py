"""gateway.router and the decode reservation of gateway.flow: how requests spread over equal
decode workers (scripted decode-worker faces on loopback)."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc

from gateway.deadline import Deadline
from gateway.flow import Job, _reserve
from gateway.router import Router
from pdserve.proto import worker_pb2, worker_pb2_grpc


class Reserving(worker_pb2_grpc.DecodeWorkerServicer):
    """Reserve records the request and answers once `gate` is set (RESOURCE_EXHAUSTED if full)."""

    def __init__(self, gate: asyncio.Event, full: bool = False) -> None:
        self.gate, self.full, self.requests = gate, full, []

    async def Reserve(self, request, context):
        self.requests.append(request.request_id)
        await self.gate.wait()
        if self.full:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
        return worker_pb2.KvTarget(request_id=request.request_id, lease_ms=5000)


async def _serve(servicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_equal_decode_workers_take_turns_between_prefill_picks() -> None:
    """Each request picks a prefill worker, then a decode worker; with equal loads the decode
    picks alternate (one turn counter for both pools sent them all to one worker)."""
    async def main() -> list[str]:
        router = Router(["127.0.0.1:9"], ["127.0.0.1:10", "127.0.0.1:11"])
        try:
            picks = []
            for _ in range(6):
                router.pick_prefill([1, 2, 3])
                picks.append(router.pick(router.decode).address)
            return picks
        finally:
            await router.close()

    assert sorted(Counter(asyncio.run(main())).values()) == [3, 3]


def _burst(full: tuple[bool, bool]) -> tuple[list[int], list[int], list[int]]:
    """20 reservations at once, each after its prefill pick: (each worker's inflight while all
    wait for an answer, the Reserve calls each worker got, each worker's inflight after)."""
    async def main():
        gate = asyncio.Event()
        servicers = [Reserving(gate, f) for f in full]
        served = [await _serve(s) for s in servicers]
        router = Router(["127.0.0.1:9"], [addr for _, addr in served])
        try:
            async def one(i: int):
                job = Job(f"r{i}", [1, 2, 3], worker_pb2.WorkerSampling(), lambda t: None)
                router.pick_prefill(job.prompt)
                return await _reserve(job, router, Deadline(10), [])

            tasks = [asyncio.ensure_future(one(i)) for i in range(20)]
            for _ in range(500):
                if sum(len(s.requests) for s in servicers) >= 20:
                    break
                await asyncio.sleep(0.01)
            during = [w.inflight for w in router.decode]
            gate.set()
            got = await asyncio.wait_for(asyncio.gather(*tasks), 10)
            assert sorted(t.request_id for _, t in got) == sorted(f"r{i}" for i in range(20))
            return during, [len(s.requests) for s in servicers], [w.inflight for w in router.decode]
        finally:
            await router.close()
            for server, _ in served:
                await server.stop(None)

    return asyncio.run(main())


def test_a_burst_of_reservations_spreads_over_equal_workers() -> None:
    """A reservation counts as the worker's load from before its Reserve call, so 20 arrivals
    at once split 10/10 (counted after the call they all ranked the same idle worker first);
    the count stays with the request after the answer (its stream ends it)."""
    during, calls, after = _burst((False, False))
    assert during == [10, 10] and calls == [10, 10] and after == [10, 10]


def test_a_full_worker_gives_its_count_back() -> None:
    """Refused reservations (RESOURCE_EXHAUSTED) leave no load behind: all go to the other."""
    during, calls, after = _burst((True, False))
    assert calls[1] == 20 and after == [0, 20]
