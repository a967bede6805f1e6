"""Fake prefill and decode workers that speak the real worker.proto services, for measuring the
gateway alone: Reserve returns a KvTarget at once, Prefill returns a first token at once, Decode
streams one token per request at every tick of a fixed-interval clock (like one continuous batch
stepping every --interval-ms), GetStats answers.

With --slots N > 1 the streams are spread over N phases (stream i gets its tokens at the ticks
k of a clock of period interval / N with k % N == i % N), as with N staggered decode batches.

Token ids encode the tick: a token sent at tick k (due at k * period on the monotonic clock) has
id k % vocab-size. With --emit-log PATH the decode worker also appends, when a stream ends, one
line `request_id t1 t2 ...`: the monotonic time (seconds) of the step that made each decode token
(the clock's wake-up for its tick: all tokens of a tick share it, as the tokens of one engine
step do), so a client on the same host can tell how long each token took to reach it from the
engine, whichever path (per-request Decode streams or the multiplexed Subscribe stream) it took.

    python bench/fake_workers.py --role decode --port 50053 --interval-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Callable
from typing import TextIO

import grpc

from pdserve import serving
from pdserve.proto import kv_pb2, worker_pb2, worker_pb2_grpc

LENGTH = worker_pb2.WORKER_FINISH_LENGTH


class Clock:
    """One asyncio task that wakes at k * interval (monotonic) and hands tick k to the subscribers
    of slot k % slots (every subscriber when slots is 1)."""

    def __init__(self, interval: float, slots: int = 1) -> None:
        self.interval, self.slots = interval, slots
        self.subscribers: dict[asyncio.Queue[tuple[int, float]], int] = {}
        self.listeners: list[Callable[[int, float], None]] = []  # called with every tick (k, time)
        self.task: asyncio.Task[None] | None = None
        self.joined = 0

    def subscribe(self) -> asyncio.Queue[tuple[int, float]]:
        q: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
        self.subscribers[q] = self.next_slot()
        return q

    def next_slot(self) -> int:
        """The slot of the next stream to join (streams take the slots in turn)."""
        if self.task is None:
            self.task = asyncio.create_task(self._tick())
        self.joined += 1
        return (self.joined - 1) % self.slots

    async def _tick(self) -> None:
        k = math.floor(time.monotonic() / self.interval) + 1
        while True:
            await asyncio.sleep(max(0.0, k * self.interval - time.monotonic()))
            now = time.monotonic()  # the step that makes tick k's tokens ends now
            for q, slot in list(self.subscribers.items()):
                if slot == k % self.slots:
                    q.put_nowait((k, now))
            for listener in list(self.listeners):
                listener(k, now)
            k = max(k + 1, math.floor(time.monotonic() / self.interval) + 1)  # skip ticks we slept through


def _stats(role: str, blocks: int, running: int = 0) -> worker_pb2.WorkerStats:
    return worker_pb2.WorkerStats(role=role, free_blocks=blocks, total_blocks=blocks, running=running,
                                  model="fake", max_model_len=1 << 20)


class FakePrefill(worker_pb2_grpc.PrefillWorkerServicer):
    """Returns the first token immediately (its id encodes the current tick)."""

    def __init__(self, clock: Clock, vocab: int) -> None:
        self.clock, self.vocab = clock, vocab

    async def Prefill(self, request, context) -> worker_pb2.PrefillResponse:
        tick = math.floor(time.monotonic() / self.clock.interval)
        return worker_pb2.PrefillResponse(first_token=tick % self.vocab)

    async def Abort(self, request, context) -> worker_pb2.AbortResponse:
        return worker_pb2.AbortResponse(found=False)

    async def GetStats(self, request, context) -> worker_pb2.WorkerStats:
        return _stats("prefill", 1 << 16)


class _FakeSub:
    """The requests of one Subscribe stream: slot, tokens left, emit times."""

    def __init__(self, slots: int, vocab: int) -> None:
        self.slots, self.vocab = slots, vocab
        # (message, its request ids, those it ends, step time)
        self.queue: asyncio.Queue[tuple[worker_pb2.StepTokens, list[str], list[str], float]] = asyncio.Queue()
        self.slot: dict[str, int] = {}
        self.left: dict[str, int] = {}
        self.emitted: dict[str, list[float]] = {}

    def add(self, rid: str, slot: int, count: int) -> None:
        self.slot[rid], self.left[rid], self.emitted[rid] = slot, count, []

    def tick(self, k: int, now: float) -> None:
        msg, rids, ended = worker_pb2.StepTokens(), [], []
        for rid, slot in list(self.slot.items()):
            if slot == k % self.slots:
                self.left[rid] -= 1
                rids.append(rid)
                finish = worker_pb2.WORKER_FINISH_NONE
                if self.left[rid] == 0:  # its last token: it leaves now (later ticks skip it)
                    finish = LENGTH
                    ended.append(rid)
                    del self.slot[rid], self.left[rid]
                msg.batches.add(request_id=rid, token_ids=[k % self.vocab], finish=finish)
        if rids:
            self.queue.put_nowait((msg, rids, ended, now))

    def remove(self, rid: str) -> bool:
        """An aborted request leaves (True if it was here)."""
        self.emitted.pop(rid, None)
        self.slot.pop(rid, None)
        return self.left.pop(rid, None) is not None


class FakeDecode(worker_pb2_grpc.DecodeWorkerServicer):
    """Streams max_tokens - 1 tokens (the prefill worker sent the first), one per clock tick."""

    def __init__(self, clock: Clock, vocab: int, block_size: int = 16, emit_log: TextIO | None = None) -> None:
        self.clock, self.vocab, self.block_size = clock, vocab, block_size
        self.running = 0  # per-request Decode/Generate streams (subscriptions count their own)
        self.emit_log = emit_log
        self.subs: dict[str, _FakeSub] = {}

    async def Reserve(self, request, context) -> worker_pb2.KvTarget:
        n = -(-request.num_tokens // self.block_size)
        layout = kv_pb2.KvLayout(model="fake", block_size=self.block_size, hash="fake")
        return worker_pb2.KvTarget(request_id=request.request_id, block_ids=range(n), layout=layout,
                                   backend="tcp", address="127.0.0.1:1", lease_ms=30000,
                                   num_tokens=request.num_tokens)

    async def Decode(self, request, context):
        async for batch in self._stream(request.request_id, request.sampling.max_tokens - 1):
            yield batch

    async def Generate(self, request, context):
        async for batch in self._stream(request.request_id, request.sampling.max_tokens):
            yield batch

    async def _stream(self, rid: str, count: int):
        q = self.clock.subscribe()
        self.running += 1
        emitted: list[float] = []
        try:
            for i in range(count):
                tick, stepped = await q.get()
                finish = LENGTH if i == count - 1 else worker_pb2.WORKER_FINISH_NONE
                batch = worker_pb2.TokenBatch(token_ids=[tick % self.vocab], finish=finish)
                emitted.append(stepped)
                yield batch
        finally:
            self.clock.subscribers.pop(q, None)
            self.running -= 1
            if self.emit_log is not None and emitted:
                self.emit_log.write(rid + " " + " ".join(f"{t:.6f}" for t in emitted) + "\n")

    async def Subscribe(self, request, context):
        """One StepTokens per tick with a token of every request of this subscription whose
        slot the tick is (a real decode worker's step: all its requests' tokens at once)."""
        sid = request.subscriber_id
        sub = self.subs[sid] = _FakeSub(self.clock.slots, self.vocab)
        self.clock.listeners.append(sub.tick)
        try:
            yield worker_pb2.StepTokens()
            while True:
                msg, rids, ended, stepped = await sub.queue.get()
                for rid in rids:  # a request aborted since its tick has no entry any more
                    sub.emitted.get(rid, []).append(stepped)
                yield msg
                for rid in ended:
                    self._log(rid, sub.emitted.pop(rid, []))
        finally:
            self.clock.listeners.remove(sub.tick)
            self.subs.pop(sid, None)

    async def StartDecode(self, request, context) -> worker_pb2.Started:
        return await self._start(request.subscriber_id, request.request_id, request.sampling.max_tokens - 1, context)

    async def StartGenerate(self, request, context) -> worker_pb2.Started:
        return await self._start(request.subscriber_id, request.request_id, request.sampling.max_tokens, context)

    async def _start(self, sid: str, rid: str, count: int, context) -> worker_pb2.Started:
        sub = self.subs.get(sid)
        if sub is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"subscriber_id: {sid!r} is not subscribed")
        sub.add(rid, self.clock.next_slot(), count)
        return worker_pb2.Started()

    def _log(self, rid: str, emitted: list[float]) -> None:
        if self.emit_log is not None and emitted:
            self.emit_log.write(rid + " " + " ".join(f"{t:.6f}" for t in emitted) + "\n")

    async def Abort(self, request, context) -> worker_pb2.AbortResponse:
        for sub in self.subs.values():
            if sub.remove(request.request_id):
                return worker_pb2.AbortResponse(found=True)
        return worker_pb2.AbortResponse(found=False)

    async def GetStats(self, request, context) -> worker_pb2.WorkerStats:
        return _stats("decode", 1 << 16, self.running + sum(len(sub.left) for sub in self.subs.values()))


async def amain(args: argparse.Namespace) -> None:
    """Serve the fake role on host:port until SIGTERM."""
    clock = Clock(args.interval_ms / 1000.0 / args.slots, args.slots)
    server = serving.new_server()
    if args.role == "prefill":
        worker_pb2_grpc.add_PrefillWorkerServicer_to_server(FakePrefill(clock, args.vocab_size), server)
        names = ["pdserve.v1.PrefillWorker"]
    else:
        emit_log = open(args.emit_log, "a", buffering=1) if args.emit_log else None  # noqa: SIM115
        worker_pb2_grpc.add_DecodeWorkerServicer_to_server(FakeDecode(clock, args.vocab_size, emit_log=emit_log),
                                                           server)
        names = ["pdserve.v1.DecodeWorker"]
    health = serving.add_health(server, names)
    await serving.serve(server, f"{args.host}:{args.port}", health, names, drain_seconds=1.0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["prefill", "decode"], required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--interval-ms", type=float, default=20.0, help="decode emits one token per stream per tick")
    p.add_argument("--slots", type=int, default=1, help="spread streams over this many tick phases")
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--emit-log", default=None, help="decode: append `request_id t1 t2 ...` per finished stream")
    args = p.parse_args(argv)
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
