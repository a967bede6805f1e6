"""nccl backend between two real processes (gloo on CPU): round trip, layout refusal,
many concurrent transfers, a peer killed mid-transfer on either side."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pdserve.transfer.base import KvTargetSpec, TransferError
from pdserve.transfer._p2p import PairState
from pdserve.transfer.nccl import NcclKvReceiver, NcclKvSender
from nccl_peer import dst_blocks, seeded_pool, src_blocks, SRC_BLOCKS
from transfer_helpers import make_layout, poisoned_pool, random_pool, wait_until

HERE = Path(__file__).parent


def _peer(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(HERE / "nccl_peer.py"), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _line(proc: subprocess.Popen[str], prefix: str) -> str:
    line = proc.stdout.readline()
    assert line.startswith(prefix), line
    return line[len(prefix):].strip()


@pytest.fixture
def receiver():
    layout = make_layout()
    recv = NcclKvReceiver(poisoned_pool(layout, 400), layout, peer_timeout=10.0)
    yield recv
    recv.close()


def _expected(layout, receiver_pool: torch.Tensor, n: int) -> torch.Tensor:
    src = seeded_pool(layout, SRC_BLOCKS)
    want = receiver_pool.clone()
    for i in range(n):
        want[:, :, dst_blocks(i)] = src[:, :, src_blocks(i)]
    return want


@pytest.mark.parametrize("n", [1, 200])
def test_two_processes_round_trip(receiver: NcclKvReceiver, n: int) -> None:
    layout = receiver.layout
    for i in range(n):
        receiver.expect(f"r{i}", dst_blocks(i))
    want = _expected(layout, receiver._pool, n)
    proc = _peer("prefill", receiver.kv_address, str(n))
    assert proc.wait(timeout=60) == 0
    assert _line(proc, "DONE ") == str(n * layout.num_layers * 2 * layout.block_size
                                        * layout.token_bytes_per_layer)
    assert torch.equal(receiver._pool, want)
    assert all(receiver.is_complete(f"r{i}") for i in range(n))
    wait_until(lambda: receiver.pair_states() == [PairState.CLOSED])


def test_layout_mismatch_refused_in_both_processes(receiver: NcclKvReceiver) -> None:
    receiver.expect("r0", dst_blocks(0))
    before = receiver._pool.clone()
    proc = _peer("prefill", receiver.kv_address, "1", "--head-dim", "16")
    assert proc.wait(timeout=30) == 3
    message = _line(proc, "MISMATCH ")
    assert receiver.layout.describe() in message and "head_dim=16" in message.replace(" ", "")
    assert receiver.pair_states() == []
    assert torch.equal(receiver._pool, before)


def test_prefill_killed_mid_transfer(receiver: NcclKvReceiver) -> None:
    receiver.expect("r0", dst_blocks(0))
    proc = _peer("prefill", receiver.kv_address, "1", "--hang")
    _line(proc, "PUSHED")
    wait_until(lambda: receiver.received_bytes("r0") > 0, timeout=10)
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    wait_until(lambda: receiver.pair_states() == [PairState.BROKEN], timeout=10)
    assert time.monotonic() - t0 < 11  # within peer_timeout (gloo: at once)
    assert not receiver.is_complete("r0")  # the lease frees it; nothing else is touched
    receiver.forget("r0")


def test_decode_killed_mid_transfer() -> None:
    proc = _peer("decode")
    address = _line(proc, "ADDRESS ")
    layout = make_layout()
    sender = NcclKvSender(layout, peer_timeout=10.0)
    try:
        handle = sender.start(KvTargetSpec("r0", (1, 2), address, layout.compat_hash(), "nccl"),
                              random_pool(layout, 8))
        handle.push(0, [3, 4], 0)
        proc.kill()
        proc.wait()
        t0 = time.monotonic()
        with pytest.raises(TransferError) as info:
            handle.push(1, [3, 4], 0)
            handle.finish(timeout=8)
        assert info.value.retryable
        assert time.monotonic() - t0 < 9
    finally:
        sender.close()


@pytest.mark.gpu
def test_nccl_on_cuda_round_trip() -> None:
    """Decode pool on the last GPU, prefill pool on GPU 0. On one GPU NCCL refuses two ranks
    on the same device ("Duplicate GPU", seen on the H200 run): that must surface as a
    retryable TransferError at once, never a hang."""
    layout = make_layout("bfloat16")
    src = random_pool(layout, 32).to("cuda:0")
    dst = poisoned_pool(layout, 32).to(f"cuda:{torch.cuda.device_count() - 1}")
    want = dst.clone()
    want[:, :, [3, 7]] = src[:, :, [9, 1]].to(dst.device)
    receiver = NcclKvReceiver(dst, layout, peer_timeout=20.0)
    sender = NcclKvSender(layout, peer_timeout=20.0)
    try:
        receiver.expect("r1", [3, 7])
        handle = sender.start(KvTargetSpec("r1", (3, 7), receiver.kv_address,
                                           layout.compat_hash(), "nccl"), src)
        for layer in range(layout.num_layers):
            handle.push(layer, [9, 1], 0)
        if torch.cuda.device_count() < 2:
            t0 = time.monotonic()
            with pytest.raises(TransferError, match="Duplicate GPU") as info:
                handle.finish(timeout=60)
            assert info.value.retryable and time.monotonic() - t0 < 30
            return
        handle.finish(timeout=60)
        torch.cuda.synchronize()
        assert torch.equal(dst, want)
    finally:
        sender.close()
        receiver.close()
