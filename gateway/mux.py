"""One Subscribe stream per decode (or colocated) worker, carrying the tokens of every request
this gateway started there: one message per engine step, not one per request and token.

A request registers a queue under its id, then starts with StartDecode / StartGenerate naming
the stream. If the stream breaks, each request on it gets the error (UNAVAILABLE when the
worker is gone), and the next request opens a new stream. Tokens of a request nobody waits for
(a start that raced a cancel) get that request aborted on the worker.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from pdserve.proto import worker_pb2

Item = worker_pb2.TokenBatch | grpc.aio.AioRpcError
OPEN_TIMEOUT_S = 10.0  # at most this long for a worker to answer a new Subscribe
ABORT_TIMEOUT_S = 2.0


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """An AioRpcError made here (the flow handles it like one from a call)."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class _Session:
    """One open Subscribe call and the queues of the requests on it."""

    def __init__(self, stub) -> None:
        self.id = uuid.uuid4().hex
        self.stub = stub
        self.queues: dict[str, asyncio.Queue[Item]] = {}
        self.orphans: set[str] = set()  # running there, nobody here: aborted once
        self.broken: grpc.aio.AioRpcError | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.call = stub.Subscribe(worker_pb2.SubscribeRequest(subscriber_id=self.id))
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        err = rpc_error(grpc.StatusCode.UNAVAILABLE, "the worker ended the token stream")
        try:
            async for step in self.call:
                if not self.ready.done():
                    self.ready.set_result(None)  # the first message: the worker registered us
                    continue
                for batch in step.batches:
                    q = self.queues.get(batch.request_id)
                    if q is not None:
                        q.put_nowait(batch)
                    elif batch.finish == worker_pb2.WORKER_FINISH_NONE:
                        self._orphan(batch.request_id)
        except grpc.aio.AioRpcError as e:
            err = e
        except asyncio.CancelledError:
            err = rpc_error(grpc.StatusCode.UNAVAILABLE, "the gateway is shutting down")
        self.broken = err
        if not self.ready.done():
            self.ready.set_exception(err)
            self.ready.exception()  # retrieved: no "never retrieved" warning if nobody waits
        for q in self.queues.values():
            q.put_nowait(err)

    def _orphan(self, request_id: str) -> None:
        """Tokens of a request nobody here waits for (its start raced a cancel): abort it there."""
        if request_id in self.orphans:
            return
        if len(self.orphans) > 4096:
            self.orphans.clear()
        self.orphans.add(request_id)
        call = self.stub.Abort(worker_pb2.AbortRequest(request_id=request_id), timeout=ABORT_TIMEOUT_S)
        asyncio.ensure_future(call).add_done_callback(lambda f: f.cancelled() or f.exception())


class TokenMux:
    """The Subscribe stream of one worker (opened on first use, reopened after a break)."""

    def __init__(self, stub) -> None:
        self._stub = stub
        self._session: _Session | None = None

    async def stream(self, request_id: str, start: Callable[[str], Awaitable[object]],
                     timeout: float | None) -> AsyncIterator[worker_pb2.TokenBatch]:
        """Token batches of request_id, started by `start(subscriber_id)`, until its finish.
        Raises AioRpcError: the start's, the stream's, or DEADLINE_EXCEEDED after `timeout` s
        (None: no limit)."""
        session = await self._open(OPEN_TIMEOUT_S if timeout is None else min(timeout, OPEN_TIMEOUT_S))
        q: asyncio.Queue[Item] = asyncio.Queue()
        session.queues[request_id] = q
        timer = None if timeout is None else asyncio.get_running_loop().call_later(
            timeout, q.put_nowait, rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
        try:
            if session.broken is not None:
                raise session.broken
            await start(session.id)
            while True:
                item = await q.get()
                if isinstance(item, grpc.aio.AioRpcError):
                    raise item
                yield item
                if item.finish != worker_pb2.WORKER_FINISH_NONE:
                    return
        finally:
            if timer is not None:
                timer.cancel()
            session.queues.pop(request_id, None)

    async def _open(self, timeout: float) -> _Session:
        session = self._session
        if session is None or session.broken is not None:
            session = self._session = _Session(self._stub)
        try:
            await asyncio.wait_for(asyncio.shield(session.ready), timeout)
        except asyncio.TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "the worker's token stream did not open in time") from None
        return session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.call.cancel()
            session.task.cancel()
            await asyncio.gather(session.task, return_exceptions=True)
