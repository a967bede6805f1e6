"""gateway.mux.TokenMux against a real gRPC decode-worker face on loopback (a scripted servicer)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.mux import TokenMux
from pdserve.proto import worker_pb2, worker_pb2_grpc

NONE, LENGTH = worker_pb2.WORKER_FINISH_NONE, worker_pb2.WORKER_FINISH_LENGTH


class Scripted(worker_pb2_grpc.DecodeWorkerServicer):
    """Subscribe sends the steps put on `steps` (None ends the stream); Abort is recorded."""

    def __init__(self) -> None:
        self.steps: asyncio.Queue[worker_pb2.StepTokens | None] = asyncio.Queue()
        self.aborted: list[str] = []
        self.subscribers: list[str] = []

    async def Subscribe(self, request, context):
        self.subscribers.append(request.subscriber_id)
        yield worker_pb2.StepTokens()
        while (step := await self.steps.get()) is not None:
            yield step

    async def Abort(self, request, context):
        self.aborted.append(request.request_id)
        return worker_pb2.AbortResponse(found=True)


def step(*batches: tuple[str, list[int], int]) -> worker_pb2.StepTokens:
    msg = worker_pb2.StepTokens()
    for rid, ids, finish in batches:
        msg.batches.add(request_id=rid, token_ids=ids, finish=finish)
    return msg


async def with_server(body) -> None:
    servicer = Scripted()
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    mux = TokenMux(worker_pb2_grpc.DecodeWorkerStub(channel))
    try:
        await body(servicer, mux)
    finally:
        await mux.close()
        await channel.close()
        await server.stop(None)


async def collect(mux: TokenMux, rid: str, on_start, timeout: float | None = 5.0) -> list[list[int]]:
    out = []
    async for batch in mux.stream(rid, on_start, timeout):
        out.append(list(batch.token_ids))
    return out


def test_routes_by_request_and_aborts_orphans_once() -> None:
    async def body(servicer: Scripted, mux: TokenMux) -> None:
        async def start(sid: str) -> None:  # the worker's StartDecode, scripted
            assert sid == servicer.subscribers[-1]
            await servicer.steps.put(step(("a", [1], NONE), ("stray", [7], NONE), ("b", [2], NONE)))
            await servicer.steps.put(step(("b", [3, 4], LENGTH), ("stray", [8], NONE), ("a", [5], LENGTH)))

        async def start_b(sid: str) -> None:
            pass

        got_b = asyncio.ensure_future(collect(mux, "b", start_b))
        await asyncio.sleep(0.1)  # b registered before a starts the script
        assert await collect(mux, "a", start) == [[1], [5]]
        assert await got_b == [[2], [3, 4]]
        await asyncio.sleep(0.2)
        assert servicer.aborted == ["stray"]
        assert len(servicer.subscribers) == 1  # both requests shared one stream

    asyncio.run(with_server(body))


def test_a_broken_stream_fails_its_requests_and_the_next_reopens() -> None:
    async def body(servicer: Scripted, mux: TokenMux) -> None:
        async def start(sid: str) -> None:
            await servicer.steps.put(step(("a", [1], NONE)))
            await servicer.steps.put(None)  # the worker ends the stream mid-request

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(mux, "a", start)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE

        async def start2(sid: str) -> None:
            await servicer.steps.put(step(("c", [9], LENGTH)))

        assert await collect(mux, "c", start2) == [[9]]
        assert len(servicer.subscribers) == 2

    asyncio.run(with_server(body))


def test_deadline_and_failed_start() -> None:
    async def body(servicer: Scripted, mux: TokenMux) -> None:
        async def silent(sid: str) -> None:
            pass

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(mux, "slow", silent, timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        async def refused(sid: str) -> None:
            raise grpc.aio.AioRpcError(grpc.StatusCode.FAILED_PRECONDITION, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), details="no reservation")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(mux, "r", refused)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    asyncio.run(with_server(body))
