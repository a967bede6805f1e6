"""Abort ordering of the direct-write protocol (cuda_ipc's) on CPU: a block is never written
after the decode side freed it.

The real cuda_ipc sender handle and the real receiver (DirectWriteReceiver, the cuda_ipc
receiver minus the CUDA pool export) talk real gRPC on 127.0.0.1; only the copy engine is a
CPU stand-in for the CUDA copy stream: copies are queued and land later on a worker thread
(after a gate opens), which is exactly what made a queued GPU copy land after an abort.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator, Sequence

import grpc
import pytest
import torch

from decode_service.engine import DecodeEngine
from decode_service.server import DecodeServicer
from pdserve.core.block_manager import BlockManager
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.proto import kv_pb2_grpc
from pdserve.runtime.loop import EngineLoop
from pdserve.transfer._attach import ControlLink, DirectWriteReceiver
from pdserve.transfer.base import KvTargetSpec, TransferError, TransferState
from pdserve.transfer.cuda_ipc import _IpcSendHandle
from pdserve.transfer.tcp import TCP_GRPC_OPTIONS
from pdtest.fake_runner import FakeRunner
from transfer_helpers import AioServer, layer_bytes, make_layout, poisoned_pool, random_pool, wait_until

SRC, DST = [5, 0, 22, 9], [17, 3, 29, 8]
REUSED = -5.0  # what the decode side writes into blocks it reassigned
GRACE_S = 0.6


class QueuedCopier:
    """A copy stream on CPU: copy() queues, a worker thread applies once `gate` is open;
    synchronize() returns when everything queued has landed."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.queued = 0
        self.landed = 0
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, layer: int | None, src_ids: Sequence[int],
             dst_ids: Sequence[int], after: object = None) -> None:
        self.queued += 1
        layers = slice(None) if layer is None else slice(layer, layer + 1)
        data = src[layers][:, :, list(src_ids)].clone()  # the source may be overwritten at once
        self._queue.put((dst, layers, list(dst_ids), data))

    def synchronize(self) -> None:
        self._queue.join()

    def _run(self) -> None:
        while True:
            dst, layers, dst_ids, data = self._queue.get()
            self.gate.wait()
            dst[layers][:, :, dst_ids] = data
            self.landed += 1
            self._queue.task_done()


class Rig:
    def __init__(self) -> None:
        self.layout = make_layout()
        self.src, self.dst = random_pool(self.layout, 32), poisoned_pool(self.layout, 32)
        self.receiver = DirectWriteReceiver(self.dst, self.layout, writer_grace_s=GRACE_S)
        self.server = AioServer(self.receiver)
        self.channel = grpc.insecure_channel(self.server.address, options=TCP_GRPC_OPTIONS)
        self.copier = QueuedCopier()
        self.control = ControlLink(kv_pb2_grpc.KvTransferStub(self.channel))  # the sender's stream
        self.released = threading.Event()
        self.released_at = 0.0

    def handle(self, rid: str = "r1", blocks: Sequence[int] = tuple(DST)) -> _IpcSendHandle:
        target = KvTargetSpec(rid, tuple(blocks), self.server.address, self.layout.compat_hash(),
                              "cuda_ipc")
        return _IpcSendHandle(target, self.src, self.layout, self.control, self.dst, self.copier,
                              attach_timeout=5.0)

    def hold_attach(self) -> threading.Event:
        """The receiver answers attaches only once the returned event is set."""
        answer = threading.Event()
        attach = self.receiver.attach

        def held(*args, **kw):
            answer.wait(10)
            return attach(*args, **kw)

        self.receiver.attach = held
        return answer

    def reuse_blocks(self) -> None:
        """The decode engine's on_released: the blocks go back to the pool and get new data."""
        self.released_at = time.monotonic()
        self.dst[:, :, DST] = REUSED
        self.released.set()

    def close(self) -> None:
        self.copier.gate.set()
        self.control.close()
        self.channel.close()
        self.server.stop()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.close()


def push_attached(rig: Rig, handle) -> None:
    """Push the last layer: it waits for the attach answer, then queues its copy at once (an
    earlier layer's push made before the answer is kept until the engine side's next call)."""
    before = rig.copier.queued
    handle.push(rig.layout.num_layers - 1, SRC, 0)
    assert rig.copier.queued == before + 1


def _reused_blocks_intact(rig: Rig) -> bool:
    return bool((rig.dst[:, :, DST] == REUSED).all())


def test_forget_while_a_copy_is_queued_frees_only_after_it_landed(rig: Rig) -> None:
    rig.receiver.expect("r1", DST)
    handle = rig.handle()
    handle.push(0, SRC, 0)  # kept until the attach answer, then queued by the next push
    wait_until(handle._answered.is_set)
    handle.push(1, SRC, 0)  # queues both; neither lands: the gate is closed
    wait_until(lambda: rig.copier.queued == 2)
    assert rig.receiver.forget("r1", on_released=rig.reuse_blocks) is False
    wait_until(lambda: handle.state == TransferState.FAILED)  # told by the Attach event
    handle.push(2, SRC, 0)  # no-op now: nothing more is queued
    time.sleep(0.3)
    assert not rig.released.is_set() and rig.copier.queued == 2 and rig.copier.landed == 0
    rig.copier.gate.set()  # the queued copies land, then the sender synchronises and releases
    assert rig.released.wait(5)
    assert rig.copier.landed == 2
    time.sleep(0.2)
    assert _reused_blocks_intact(rig)  # nothing was written after the blocks were reused
    with pytest.raises(TransferError) as info:
        handle.finish(timeout=5)
    assert info.value.code == "NOT_FOUND"


def test_sender_aborted_first_releases_after_its_copies(rig: Rig) -> None:
    rig.receiver.expect("r1", DST)
    handle = rig.handle()
    push_attached(rig, handle)
    handle.abort()  # the prefill side gave up; its copy is still queued
    assert rig.receiver.forget("r1", on_released=rig.reuse_blocks) is False
    time.sleep(0.2)
    assert not rig.released.is_set()
    rig.copier.gate.set()
    assert rig.released.wait(5) and rig.copier.landed == 1
    time.sleep(0.2)
    assert _reused_blocks_intact(rig)


def test_released_writer_lets_forget_free_at_once(rig: Rig) -> None:
    rig.receiver.expect("r1", DST)
    rig.copier.gate.set()
    handle = rig.handle()
    push_attached(rig, handle)
    handle.abort()
    wait_until(lambda: rig.receiver._reservations["r1"].writer.done)
    assert rig.receiver.forget("r1", on_released=rig.reuse_blocks) is True


def test_forgotten_before_attach_is_refused_and_nothing_is_written(rig: Rig) -> None:
    rig.receiver.expect("r1", DST)
    assert rig.receiver.forget("r1") is True  # no writer: free at once
    before = rig.dst.clone()
    handle = rig.handle()  # the first push attaches; its copy waits for the answer
    handle.push(0, SRC, 0)
    wait_until(lambda: handle.state == TransferState.FAILED)
    assert rig.copier.queued == 0
    with pytest.raises(TransferError) as info:
        handle.finish(timeout=5)
    assert info.value.code == "NOT_FOUND"
    assert torch.equal(rig.dst, before)


def test_attach_with_other_blocks_is_refused(rig: Rig) -> None:
    rig.receiver.expect("r1", [1, 2, 3, 4])
    handle = rig.handle()
    handle.push(0, SRC, 0)
    with pytest.raises(TransferError) as info:
        handle.finish(timeout=5)
    assert info.value.code == "INVALID_ARGUMENT" and "block_ids" in str(info.value)
    assert rig.copier.queued == 0


def test_transfer_without_pushes_waits_for_the_attach(rig: Rig) -> None:
    """Nothing to send (the decode side had every block cached): finish still attaches first."""
    rig.receiver.expect("r1", DST)
    assert rig.receiver.forget("r1") is True
    with pytest.raises(TransferError) as info:
        rig.handle().finish(timeout=5)
    assert info.value.code == "NOT_FOUND"


def test_abort_before_the_first_push_opens_nothing_and_frees_at_once(rig: Rig) -> None:
    """start() opens no call (the first push does); an abort before it leaves the receiver's
    reservation without a writer (it can be forgotten and freed at once), and finish raises."""
    rig.receiver.expect("r1", DST)
    handle = rig.handle()
    handle.abort()
    with pytest.raises(TransferError) as info:
        handle.finish(timeout=5)
    assert info.value.code == "CANCELLED"
    assert not rig.receiver.writer_attached("r1")
    assert rig.receiver.forget("r1", on_released=rig.reuse_blocks) is True
    assert rig.copier.queued == 0
    handle.push(0, SRC, 0)  # a no-op once aborted: still no call, no copy
    assert rig.copier.queued == 0 and handle._link is None


def test_lost_writer_is_released_after_the_grace(rig: Rig) -> None:
    rig.receiver.expect("r1", DST)
    rig.copier.gate.set()
    handle = rig.handle()
    push_attached(rig, handle)  # attached, its copy queued
    rig.control._call.cancel()  # the sender's stream breaks without a release (it died)
    wait_until(lambda: handle.state == TransferState.FAILED)
    t0 = time.monotonic()
    assert rig.receiver.forget("r1", on_released=rig.reuse_blocks) is False
    assert rig.released.wait(GRACE_S + 2)
    assert rig.released_at - t0 >= GRACE_S * 0.5  # held until the grace ran out


def test_full_transfer_lands_and_completes(rig: Rig) -> None:
    rig.receiver.expect("r1", DST)
    rig.copier.gate.set()
    handle = rig.handle()
    for layer in range(rig.layout.num_layers):
        handle.push(layer, SRC, 0)
    stats = handle.finish(timeout=10)
    assert stats.bytes == rig.layout.num_layers * layer_bytes(rig.layout, len(SRC))
    assert rig.receiver.is_complete("r1")
    assert torch.equal(rig.dst[:, :, DST], rig.src[:, :, SRC])
    assert rig.receiver.forget("r1") is True  # decode takes the blocks over


def test_pushes_are_summarised_and_counted_at_finish(rig: Rig) -> None:
    """No metadata on the wire per push: finish() sends one summary per run of layers (one
    all-layers copy, then layer by layer) after the copies landed; the receiver counts it all."""
    rig.receiver.expect("r1", DST)
    rig.copier.gate.set()
    handle = rig.handle()
    handle.push_all_layers(SRC[:2], 0)
    for layer in range(rig.layout.num_layers):
        handle.push(layer, SRC[2:], 2)
    assert rig.copier.queued == 1 + rig.layout.num_layers
    time.sleep(0.2)
    assert rig.receiver.received_bytes("r1") == 0 and not rig.receiver.is_complete("r1")
    stats = handle.finish(timeout=10)
    assert stats.bytes == rig.receiver.received_bytes("r1") == rig.layout.num_layers * layer_bytes(rig.layout, 4)
    assert rig.receiver.is_complete("r1")
    assert torch.equal(rig.dst[:, :, DST], rig.src[:, :, SRC])
    with pytest.raises(ValueError, match="outside the pool"):
        rig.handle("r2").push(0, [0, 99], 0)


def test_decode_engine_keeps_aborted_blocks_until_the_writer_released(rig: Rig) -> None:
    """The decode worker's own engine over the real receiver: an aborted reservation's blocks
    stay allocated while the attached writer's copy is queued, and are free after its release."""
    blocks = BlockManager(32, rig.layout.block_size)
    loop = EngineLoop(Scheduler(SchedulerConfig(), blocks), FakeRunner(rig.layout.block_size))
    engine = DecodeEngine(loop, rig.receiver, eos_ids=(0,), lease_s=30.0)
    reserved, cached = engine.reserve("r1", 4 * rig.layout.block_size)
    assert cached == 0
    handle = rig.handle("r1", reserved)
    push_attached(rig, handle)  # queued behind the closed gate
    free_before = blocks.num_free
    assert engine.abort("r1")
    time.sleep(0.3)
    assert blocks.num_free == free_before  # still held: the copy has not landed
    rig.copier.gate.set()
    wait_until(lambda: blocks.num_free == free_before + len(reserved))
    assert rig.copier.landed == 1


def test_pushes_before_the_attach_answer_never_wait(rig: Rig) -> None:
    """The engine thread does not wait for the network before the last layer: earlier pushes
    are kept and queued (in order) once the receiver said yes; the last layer's push waits for
    the yes, so the engine's stream can wait for every copy."""
    rig.receiver.expect("r1", DST)
    rig.copier.gate.set()
    answer = rig.hold_attach()  # the decode side is slow to answer
    handle = rig.handle()
    t0 = time.monotonic()
    for layer in range(rig.layout.num_layers - 1):
        handle.push(layer, SRC, 0)
    assert time.monotonic() - t0 < 0.5 and rig.copier.queued == 0
    last = threading.Thread(target=handle.push, args=(rig.layout.num_layers - 1, SRC, 0))
    last.start()
    time.sleep(0.3)
    assert last.is_alive() and rig.copier.queued == 0  # waits for the yes
    answer.set()
    last.join(5)
    assert not last.is_alive() and rig.copier.queued == rig.layout.num_layers
    handle.finish(timeout=10)
    assert torch.equal(rig.dst[:, :, DST], rig.src[:, :, SRC])


def test_kept_pushes_are_dropped_when_the_attach_is_refused(rig: Rig) -> None:
    rig.receiver.expect("r1", DST)
    rig.copier.gate.set()
    answer = rig.hold_attach()
    handle = rig.handle()
    handle.push(0, SRC, 0)
    assert rig.receiver.forget("r1") is True  # no writer yet: freed at once
    answer.set()
    wait_until(lambda: handle.state == TransferState.FAILED)
    handle.push(1, SRC, 0)
    time.sleep(0.2)
    assert rig.copier.queued == 0 and bool((rig.dst[:, :, DST] != rig.src[:, :, SRC]).all())


def test_seal_returns_once_the_bytes_landed_and_finish_takes_the_ack(rig: Rig) -> None:
    """seal(): every copy landed, the summary and the last chunk are on their way, the writer
    released; the receiver completes without further pushes, and finish() returns its ack."""
    rig.receiver.expect("r1", DST)
    rig.copier.gate.set()
    handle = rig.handle()
    for layer in range(rig.layout.num_layers):
        handle.push(layer, SRC, 0)
    sealed = handle.seal(timeout=10)
    assert torch.equal(rig.dst[:, :, DST], rig.src[:, :, SRC])  # visible on return
    assert sealed.bytes == rig.layout.num_layers * layer_bytes(rig.layout, len(SRC))
    wait_until(lambda: rig.receiver.is_complete("r1"))
    with pytest.raises(RuntimeError):
        handle.seal(timeout=1)
    assert handle.finish(timeout=10).bytes == sealed.bytes == rig.receiver.received_bytes("r1")
    assert handle.state == TransferState.DONE
    assert rig.receiver.forget("r1") is True


def test_decode_start_waits_while_the_last_chunk_is_on_the_way(rig: Rig) -> None:
    """A direct writer's prefill answers after seal(), so the gateway's Decode can arrive before
    the last chunk: the decode worker waits for it; an aborted or expired reservation ends the
    wait (start() then reports it)."""
    rig.copier.gate.set()
    blocks = BlockManager(32, rig.layout.block_size)
    loop = EngineLoop(Scheduler(SchedulerConfig(), blocks), FakeRunner(rig.layout.block_size))
    engine = DecodeEngine(loop, rig.receiver, eos_ids=(0,), lease_s=30.0)
    servicer = DecodeServicer(engine, rig.layout, rig.server.address, "cuda_ipc", "tiny")
    reserved, _ = engine.reserve("r1", 4 * rig.layout.block_size)
    engine.reserve("r2", rig.layout.block_size)
    handle = rig.handle("r1", reserved)

    async def scenario() -> None:
        waiter = asyncio.ensure_future(servicer._kv_arrived("r1"))
        other = asyncio.ensure_future(servicer._kv_arrived("r2"))
        await asyncio.sleep(0.2)
        assert not waiter.done() and engine.kv_on_the_way("r1")
        for layer in range(rig.layout.num_layers):
            handle.push(layer, SRC, 0)
        await asyncio.to_thread(handle.finish, 10)
        await asyncio.wait_for(waiter, 5)
        assert not engine.kv_on_the_way("r1") and not other.done()
        assert engine.abort("r2")
        await asyncio.wait_for(other, 5)

    asyncio.run(scenario())
    assert torch.equal(rig.dst[:, :, reserved], rig.src[:, :, SRC])


def test_requests_share_one_control_stream_and_fail_alone(rig: Rig) -> None:
    """Every request between a sender and a receiver goes over one Control stream: one refused
    request (forgotten before its attach) does not disturb another in flight on the stream."""
    rig.copier.gate.set()
    rig.receiver.expect("a", DST)
    other = [1, 2, 4, 6]
    rig.receiver.expect("b", other)
    good = rig.handle("a")
    doomed = rig.handle("b", other)
    assert rig.receiver.forget("b") is True
    for layer in range(rig.layout.num_layers):
        good.push(layer, SRC, 0)
        doomed.push(layer, SRC, 0)
    with pytest.raises(TransferError) as info:
        doomed.finish(timeout=5)
    assert info.value.code == "NOT_FOUND"
    assert good.finish(timeout=10).bytes == rig.receiver.received_bytes("a")
    assert torch.equal(rig.dst[:, :, DST], rig.src[:, :, SRC])
    assert bool((rig.dst[:, :, other] != rig.src[:, :, SRC]).all())  # nothing written for b
    assert rig.control.alive


def test_a_receiver_that_goes_away_fails_every_writer_on_its_stream(rig: Rig) -> None:
    rig.copier.gate.set()
    handles = []
    for rid in ("x", "y"):
        blocks = DST if rid == "x" else [1, 2, 4, 6]
        rig.receiver.expect(rid, blocks)
        handle = rig.handle(rid, blocks)
        push_attached(rig, handle)
        handles.append(handle)
    assert rig.copier.queued == 2  # both attached
    rig.server.stop()
    for handle in handles:
        wait_until(lambda h=handle: h.state == TransferState.FAILED)
        with pytest.raises(TransferError) as info:
            handle.finish(timeout=5)
        assert info.value.retryable
    wait_until(lambda: not rig.control.alive)


def test_sender_maps_the_pool_again_after_its_control_stream_broke(rig: Rig, monkeypatch) -> None:
    """The sender's bookkeeping (CUDA IPC itself needs a GPU: map_pool is replaced by a
    counter): one handshake and mapping per decode worker while its Control stream lives; once
    the stream broke (the worker went away, maybe restarted at the same address) the next
    request handshakes and maps again instead of writing through the dead process's mapping."""
    from pdserve.transfer import cuda_ipc

    maps: list[torch.Tensor] = []

    def fake_map(raw: bytes, layout) -> torch.Tensor:
        maps.append(torch.empty(0))
        return maps[-1]

    monkeypatch.setattr(cuda_ipc, "map_pool", fake_map)
    sender = cuda_ipc.CudaIpcKvSender(rig.layout)
    try:
        stub = kv_pb2_grpc.KvTransferStub(sender._channel(rig.server.address))
        first, link = sender._peer(rig.server.address, stub)
        again, same = sender._peer(rig.server.address, stub)
        assert again is first and same is link and len(maps) == 1
        link.close()
        wait_until(lambda: not link.alive)
        remapped, new_link = sender._peer(rig.server.address, stub)
        assert len(maps) == 2 and remapped is maps[1] and new_link is not link and new_link.alive
        rig.server.stop()  # the decode worker is gone for good: the handshake fails, retryable
        wait_until(lambda: not new_link.alive)
        with pytest.raises(TransferError) as info:
            sender._peer(rig.server.address, stub)
        assert info.value.retryable
    finally:
        sender.close()
