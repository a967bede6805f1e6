"""cuda_ipc: refusals that can be checked anywhere, and (under `gpu`) prefill and decode as
two processes on one GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.transfer import make_receiver
from pdserve.transfer.base import KvTargetSpec, TransferError, TransferState
from pdserve.transfer.cuda_ipc import CudaIpcKvSender, CudaIpcUnavailable, map_pool
from transfer_helpers import layer_bytes, make_layout, poisoned_pool, random_pool

HERE = Path(__file__).parent
SRC, DST = [5, 0, 22, 9, 30], [17, 3, 29, 8, 11]


def test_receiver_refuses_a_pool_not_on_cuda() -> None:
    layout = make_layout()
    with pytest.raises(CudaIpcUnavailable, match="CUDA device; it is on cpu"):
        make_receiver("cuda_ipc", poisoned_pool(layout, 8), layout)


def test_sender_refuses_a_pool_not_on_cuda() -> None:
    layout = make_layout()
    sender = CudaIpcKvSender(layout)
    target = KvTargetSpec("r1", (0,), "127.0.0.1:1", layout.compat_hash(), "cuda_ipc")
    with pytest.raises(CudaIpcUnavailable, match="CUDA device"):
        sender.start(target, random_pool(layout, 8))
    sender.close()


def test_map_refuses_other_pid_namespace_and_empty_export() -> None:
    layout = make_layout()
    with pytest.raises(CudaIpcUnavailable, match="exported no pool"):
        map_pool(b"", layout)
    with pytest.raises(CudaIpcUnavailable, match="PID namespace"):
        map_pool(b'{"pid_ns": "pid:[1]"}', layout)


def _peer() -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(HERE / "ipc_peer.py")], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _ask(proc: subprocess.Popen[str], line: str, prefix: str) -> list[str]:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return _reply(proc, prefix)


def _reply(proc: subprocess.Popen[str], prefix: str) -> list[str]:
    words = proc.stdout.readline().split()
    assert words and words[0] == prefix, words
    return words[1:]


def _ids(ids) -> str:
    return ",".join(map(str, ids))


@dataclass
class IpcPair:
    """A decode process (ipc_peer.py) on this GPU and a cuda_ipc sender pointed at it."""

    proc: subprocess.Popen[str]
    address: str
    layout: KvLayout
    src: torch.Tensor
    sender: CudaIpcKvSender

    def start(self, rid: str, blocks: list[int]):
        return self.sender.start(KvTargetSpec(rid, tuple(blocks), self.address, self.layout.compat_hash(),
                                              "cuda_ipc"), self.src)

    def ask(self, line: str, prefix: str) -> list[str]:
        return _ask(self.proc, line, prefix)

    def assert_arrived(self, rid: str, src_ids: list[int], dst_ids: list[int]) -> None:
        """The decode side holds src_ids' KV in dst_ids and marked the request complete."""
        expected = self.src[:, :, src_ids].float().cpu()
        complete, total, absolute = self.ask(f"dump {rid} {_ids(dst_ids)}", "STATE")
        assert complete == "True"
        assert float(total) == pytest.approx(expected.sum().item(), rel=1e-4, abs=1e-3)
        assert float(absolute) == pytest.approx(expected.abs().sum().item(), rel=1e-4)


@pytest.fixture
def pair() -> Iterator[IpcPair]:
    layout = make_layout("bfloat16")
    proc = _peer()
    sender = CudaIpcKvSender(layout)
    try:
        yield IpcPair(proc, _reply(proc, "ADDRESS")[0], layout, random_pool(layout, 32).cuda(), sender)
    finally:
        sender.close()
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.gpu
def test_forget_during_a_queued_copy_never_writes_reused_blocks(pair: IpcPair) -> None:
    """The known cuda_ipc abort race: a copy already queued on the prefill side's copy stream
    (here behind ~1 s of GPU sleep on the engine stream; the push itself must not wait for it) when the decode side forgets the
    request. The decode side must hand the blocks back only after that copy landed."""
    handle = pair.start("r1", DST)
    torch.cuda._sleep(2_000_000_000)  # the engine stream is busy; the copy queues behind it
    t0 = time.monotonic()
    handle.push(pair.layout.num_layers - 1, SRC, 0)  # the last layer's push waits for the attach answer
    assert time.monotonic() - t0 < 0.3, "push waited for the engine stream"
    assert handle._attached  # the attach answer came; the copy is queued
    assert pair.ask(f"forget r1 {_ids(DST)}", "FORGET") == ["False"]
    held = float(_reply(pair.proc, "RELEASED")[0])
    torch.cuda.synchronize()
    assert handle.state == TransferState.FAILED
    with pytest.raises(TransferError):
        handle.finish(timeout=10)
    assert pair.ask(f"reused {_ids(DST)}", "REUSED") == ["True"]
    print(f"blocks held {held:.3f} s until the sender released them")


@pytest.mark.gpu
def test_two_processes_one_gpu_round_trip(pair: IpcPair) -> None:
    handle = pair.start("r1", DST)
    handle.push_all_layers(SRC[:2], 0)  # one kernel for every layer (prefix-cached blocks)
    for layer in range(pair.layout.num_layers):
        handle.push(layer, SRC[2:], 2)
    stats = handle.finish(timeout=30)
    pair.assert_arrived("r1", SRC, DST)
    assert stats.bytes == pair.layout.num_layers * layer_bytes(pair.layout, len(SRC))


@pytest.mark.gpu
def test_contract_over_cuda_ipc(pair: IpcPair) -> None:
    """The contract suite's points over cuda_ipc, prefill and decode as two processes on one
    GPU: random block sets arrive intact; a mismatched layout is refused at connect naming both
    layouts; an abort in every state leaves the decode side free to reuse every block (at once
    when nothing was written, after the writer's release otherwise)."""
    import random

    from pdserve.transfer.base import LayoutMismatch

    layout = pair.layout
    rng = random.Random(3)
    for i in range(3):  # random block sets: all layers at once for some, per layer for the rest
        n = rng.randrange(1, 9)
        src_ids, dst_ids = rng.sample(range(32), n), rng.sample(range(32), n)
        pair.ask(f"expect rand{i} {_ids(dst_ids)}", "EXPECTED")
        handle = pair.start(f"rand{i}", dst_ids)
        cut = rng.randrange(0, n + 1)
        if cut:
            handle.push_all_layers(src_ids[:cut], 0)
        for layer in range(layout.num_layers):
            if cut < n:
                handle.push(layer, src_ids[cut:], cut)
        handle.finish(timeout=30)
        pair.assert_arrived(f"rand{i}", src_ids, dst_ids)
        pair.ask(f"forget rand{i} {_ids(dst_ids)}", "FORGET")
        _reply(pair.proc, "RELEASED")

    other = CudaIpcKvSender(make_layout("bfloat16", num_layers=layout.num_layers + 1))
    with pytest.raises(LayoutMismatch) as info:
        other.start(KvTargetSpec("x", (0,), pair.address, other.layout.compat_hash(), "cuda_ipc"), pair.src)
    assert "layers=3" in str(info.value) and "layers=4" in str(info.value)
    other.close()

    blocks = [1, 2, 4]
    for state in ("pending", "sending", "sealed"):
        rid = f"abort-{state}"
        pair.ask(f"expect {rid} {_ids(blocks)}", "EXPECTED")
        handle = pair.start(rid, blocks)
        if state != "pending":
            for layer in range(layout.num_layers):
                handle.push(layer, [5, 6, 7], 0)
        if state == "sealed":
            handle.seal(timeout=30)
        handle.abort()
        assert handle.state == TransferState.ABORTED
        pair.ask(f"forget {rid} {_ids(blocks)}", "FORGET")
        assert float(_reply(pair.proc, "RELEASED")[0]) < 6.0  # released by the writer, not the grace
        assert pair.ask(f"reused {_ids(blocks)}", "REUSED") == ["True"]  # nothing landed later
