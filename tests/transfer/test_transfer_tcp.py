"""tcp-only behaviour: dead receivers, big chunks written off the loop, completion callback."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from pdserve.transfer.base import KvTargetSpec, TransferError, TransferState
from pdserve.transfer.tcp import TcpKvReceiver, TcpKvSender
from transfer_helpers import AioServer, make_layout, poisoned_pool, random_pool


def _target(address: str, layout, block_ids) -> KvTargetSpec:
    return KvTargetSpec("r1", tuple(block_ids), address, layout.compat_hash(), "tcp")


def test_receiver_stopped_mid_transfer_fails_retryable_without_hang() -> None:
    layout = make_layout()
    receiver = TcpKvReceiver(poisoned_pool(layout, 8), layout)
    server = AioServer(receiver)
    sender = TcpKvSender(layout)
    try:
        receiver.expect("r1", [0, 1])
        handle = sender.start(_target(server.address, layout, [0, 1]), random_pool(layout, 8))
        handle.push(0, [2, 3], 0)
        server.stop()
        handle.push(1, [2, 3], 0)
        t0 = time.monotonic()
        with pytest.raises(TransferError) as info:
            handle.finish(timeout=5)
        assert time.monotonic() - t0 < 5
        assert info.value.retryable, info.value
        assert handle.state == TransferState.FAILED
    finally:
        sender.close()
        server.stop()


def test_receiver_gone_before_start_is_retryable() -> None:
    layout = make_layout()
    server = AioServer(TcpKvReceiver(poisoned_pool(layout, 8), layout))
    address = server.address
    server.stop()
    sender = TcpKvSender(layout, handshake_timeout=3)
    try:
        with pytest.raises(TransferError) as info:
            sender.start(_target(address, layout, [0]), random_pool(layout, 8))
        assert info.value.retryable and info.value.code == "UNAVAILABLE"
    finally:
        sender.close()


def test_large_chunks_and_completion_callback() -> None:
    layout = make_layout(num_kv_heads=8, head_dim=64, block_size=16, num_layers=2)
    src, dst = random_pool(layout, 48), poisoned_pool(layout, 48)
    src_blocks, dst_blocks = list(range(0, 40)), list(range(47, 7, -1))
    expected = dst.clone()
    expected[:, :, dst_blocks] = src[:, :, src_blocks]
    completed = threading.Event()
    receiver = TcpKvReceiver(dst, layout, on_complete=lambda rid: completed.set())
    server = AioServer(receiver)
    sender = TcpKvSender(layout)  # 2.5 MiB per layer: one chunk, written via to_thread
    try:
        receiver.expect("r1", dst_blocks)
        handle = sender.start(_target(server.address, layout, dst_blocks), src)
        for layer in range(layout.num_layers):
            handle.push(layer, src_blocks, 0)
        stats = handle.finish(timeout=20)
        assert stats.chunks == layout.num_layers + 1
        assert completed.is_set()
        assert torch.equal(dst, expected)
    finally:
        sender.close()
        server.stop()


def test_handshake_is_cached_per_address() -> None:
    layout = make_layout()
    receiver = TcpKvReceiver(poisoned_pool(layout, 8), layout)
    calls = []
    original = receiver.Handshake

    async def counting(request, context):
        calls.append(1)
        return await original(request, context)

    receiver.Handshake = counting  # type: ignore[method-assign]
    server = AioServer(receiver)
    sender = TcpKvSender(layout)
    try:
        for rid in ("a", "b"):
            receiver.expect(rid, [0])
            target = KvTargetSpec(rid, (0,), server.address, layout.compat_hash(), "tcp")
            handle = sender.start(target, random_pool(layout, 8))
            handle.push(0, [1], 0)
            handle.finish(timeout=10)
        assert len(calls) == 1
    finally:
        sender.close()
        server.stop()


class _StallingReceiver(TcpKvReceiver):
    """Reads every chunk but never answers: a wedged decode worker."""

    async def Push(self, request_iterator, context):  # type: ignore[override]
        async for _ in request_iterator:
            pass
        await asyncio.sleep(60)


def test_unanswered_finish_times_out_retryable() -> None:
    layout = make_layout()
    server = AioServer(_StallingReceiver(poisoned_pool(layout, 8), layout))
    sender = TcpKvSender(layout)
    try:
        handle = sender.start(_target(server.address, layout, [0]), random_pool(layout, 8))
        handle.push(0, [1], 0)
        t0 = time.monotonic()
        with pytest.raises(TransferError) as info:
            handle.finish(timeout=1.0)
        assert 0.9 < time.monotonic() - t0 < 3
        assert info.value.retryable and info.value.code == "DEADLINE_EXCEEDED"
        assert handle.state == TransferState.FAILED
    finally:
        sender.close()
        server.stop()
