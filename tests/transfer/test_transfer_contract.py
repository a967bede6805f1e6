"""The transfer contract, run over every chunk backend (tcp and loopback)."""

from __future__ import annotations

import grpc
import pytest
import torch

from pdserve.transfer._wire import encode_layer
from pdserve.transfer.base import LayoutMismatch, TransferError, TransferState
from transfer_helpers import (
    layer_bytes,
    make_layout,
    poisoned_pool,
    random_pool,
    wait_until,
)

SRC_BLOCKS = [5, 0, 22, 9, 30]
DST_BLOCKS = [17, 3, 29, 8, 11]


def _started(connect, layout, **kw):
    """A transfer of SRC_BLOCKS into DST_BLOCKS of a poisoned pool, started: (src, dst, what dst
    must become, link, handle)."""
    src, dst = random_pool(layout, 32), poisoned_pool(layout, 32)
    expected = dst.clone()
    expected[:, :, DST_BLOCKS] = src[:, :, SRC_BLOCKS]
    link = connect(dst, layout, **kw)
    link.receiver.expect("r1", DST_BLOCKS)
    return src, dst, expected, link, link.sender.start(link.target("r1", DST_BLOCKS, layout), src)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_scattered_blocks(connect, dtype: str) -> None:
    layout = make_layout(dtype)
    src, dst, expected, link, handle = _started(connect, layout)
    assert handle.state == TransferState.PENDING
    for layer in range(layout.num_layers):
        handle.push(layer, SRC_BLOCKS[:2], 0)
        handle.push(layer, SRC_BLOCKS[2:], 2)
        src[layer, :, SRC_BLOCKS] = 0  # push copied already: the engine may reuse the blocks
    assert handle.state == TransferState.SENDING
    stats = handle.finish(timeout=10)
    assert handle.state == TransferState.DONE
    assert torch.equal(dst, expected)
    assert stats.bytes == layout.num_layers * layer_bytes(layout, len(SRC_BLOCKS))
    assert stats.chunks == 2 * layout.num_layers + 1
    assert link.receiver.is_complete("r1")
    assert link.receiver.received_bytes("r1") == stats.bytes


def test_seal_makes_the_bytes_visible_then_finish_takes_the_ack(connect) -> None:
    """seal() (what the prefill worker waits for before its first token): every byte is
    visible to the receiver on return; finish() then returns the receiver's count."""
    layout = make_layout("bfloat16")
    src, dst, expected, link, handle = _started(connect, layout)
    for layer in range(layout.num_layers):
        handle.push(layer, SRC_BLOCKS, 0)
    sealed = handle.seal(timeout=10)
    assert torch.equal(dst, expected)
    assert sealed.bytes == layout.num_layers * layer_bytes(layout, len(SRC_BLOCKS))
    with pytest.raises(RuntimeError):
        handle.seal(timeout=1)
    stats = handle.finish(timeout=10)
    assert stats.bytes == sealed.bytes == link.receiver.received_bytes("r1")
    assert handle.state == TransferState.DONE and link.receiver.is_complete("r1")


def test_push_all_layers_then_per_layer(connect) -> None:
    """Blocks already complete (a prefix cache) go with push_all_layers, the rest per layer."""
    layout = make_layout("bfloat16")
    src, dst, expected, link, handle = _started(connect, layout)
    handle.push_all_layers(SRC_BLOCKS[:3], 0)
    src[:, :, SRC_BLOCKS[:3]] = 0  # copied out already (or ordered before any reuse)
    for layer in range(layout.num_layers):
        handle.push(layer, SRC_BLOCKS[3:], 3)
    stats = handle.finish(timeout=10)
    assert torch.equal(dst, expected)
    assert stats.bytes == layout.num_layers * layer_bytes(layout, len(SRC_BLOCKS))
    assert link.receiver.received_bytes("r1") == stats.bytes
    with pytest.raises(ValueError):
        handle.push_all_layers([0], 5)  # outside the target's blocks (a caller bug)


def test_chunking_splits_and_arrives_whole(connect) -> None:
    layout = make_layout("bfloat16")
    src, dst, expected, link, handle = _started(connect, layout, chunk_bytes=layer_bytes(layout, 2) + 1)
    for layer in range(layout.num_layers):
        handle.push(layer, SRC_BLOCKS, 0)
    stats = handle.finish(timeout=10)
    assert stats.chunks == 3 * layout.num_layers + 1
    assert torch.equal(dst, expected)


def test_layout_mismatch_names_both_layouts(connect) -> None:
    mine, theirs = make_layout(head_dim=8), make_layout(head_dim=16)
    link = connect(poisoned_pool(theirs, 8), theirs, sender_layout=mine)
    link.receiver.expect("r1", [0, 1])
    with pytest.raises(LayoutMismatch) as info:
        link.sender.start(link.target("r1", [0, 1], mine), random_pool(mine, 8))
    assert mine.describe() in str(info.value) and theirs.describe() in str(info.value)
    assert not info.value.retryable


def test_target_with_foreign_layout_hash_is_refused(connect) -> None:
    layout = make_layout()
    link = connect(poisoned_pool(layout, 8), layout)
    target = link.target("r1", [0, 1], make_layout(model="other"))
    with pytest.raises(LayoutMismatch, match=target.layout_hash):
        link.sender.start(target, random_pool(layout, 8))


def _bad_chunks(layout, src):
    good = encode_layer(src, 1, [2, 3], 0, "r1", layout.compat_hash(), 8)[0]

    def variant(**changes):
        chunk = type(good)()
        chunk.CopyFrom(good)
        for name, value in changes.items():
            setattr(chunk, name, value)
        return chunk

    return {
        "unknown request": (variant(request_id="nope"), grpc.StatusCode.NOT_FOUND),
        "layer out of range": (variant(layer=layout.num_layers), grpc.StatusCode.INVALID_ARGUMENT),
        "layers with data": (variant(num_layers=2), grpc.StatusCode.INVALID_ARGUMENT),  # direct writers only
        "layers out of range": (variant(num_layers=layout.num_layers), grpc.StatusCode.INVALID_ARGUMENT),
        "block offset": (variant(block_offset=1), grpc.StatusCode.INVALID_ARGUMENT),
        "block count": (variant(num_blocks=3), grpc.StatusCode.INVALID_ARGUMENT),
        "short data": (variant(data=good.data[:-1]), grpc.StatusCode.INVALID_ARGUMENT),
        "long data": (variant(data=good.data + b"\0"), grpc.StatusCode.INVALID_ARGUMENT),
        "layout hash": (variant(layout_hash="0" * 16), grpc.StatusCode.FAILED_PRECONDITION),
    }


def test_invalid_chunks_are_refused_and_nothing_written(connect) -> None:
    layout = make_layout()
    src, dst = random_pool(layout, 8), poisoned_pool(layout, 8)
    before = dst.clone()
    link = connect(dst, layout)
    link.receiver.expect("r1", [6, 7])
    for name, (chunk, code) in _bad_chunks(layout, src).items():
        assert link.deliver(chunk) == code, name
        assert torch.equal(dst, before), name
    assert link.receiver.received_bytes("r1") == 0
    assert not link.receiver.is_complete("r1")


def test_chunk_after_last_is_refused(connect) -> None:
    layout = make_layout()
    src, dst = random_pool(layout, 8), poisoned_pool(layout, 8)
    link = connect(dst, layout)
    link.receiver.expect("r1", [6, 7])
    chunk = encode_layer(src, 0, [2, 3], 0, "r1", layout.compat_hash(), 8)[0]
    chunk.last = True
    assert link.deliver(chunk) == grpc.StatusCode.OK
    after = dst.clone()
    chunk.layer = 1
    assert link.deliver(chunk) == grpc.StatusCode.INVALID_ARGUMENT
    assert torch.equal(dst, after)


def test_forget_mid_transfer_fails_sender_and_stops_writes(connect) -> None:
    layout = make_layout()
    src, dst = random_pool(layout, 32), poisoned_pool(layout, 32)
    link = connect(dst, layout)
    link.receiver.expect("r1", DST_BLOCKS)
    handle = link.sender.start(link.target("r1", DST_BLOCKS, layout), src)
    handle.push(0, SRC_BLOCKS, 0)
    wait_until(lambda: link.receiver.received_bytes("r1") == layer_bytes(layout, 5))
    # These receivers write the pool themselves: the blocks may be reused at once, so the
    # callback (for late releases of direct writers) must never be called.
    late: list[str] = []
    assert link.receiver.forget("r1", on_released=lambda: late.append("r1")) is True
    dst[:, :, DST_BLOCKS] = -1.0  # reused at once
    snapshot = dst.clone()
    for layer in range(1, layout.num_layers):
        handle.push(layer, SRC_BLOCKS, 0)
    with pytest.raises(TransferError) as info:
        handle.finish(timeout=10)
    assert info.value.code == "NOT_FOUND" and "forgotten" in str(info.value)
    assert handle.state == TransferState.FAILED
    assert torch.equal(dst, snapshot) and late == []
    with pytest.raises(KeyError):
        link.receiver.received_bytes("r1")


def test_abort_is_idempotent_and_finish_raises(connect) -> None:
    layout = make_layout()
    link = connect(poisoned_pool(layout, 8), layout)
    link.receiver.expect("r1", [0, 1])
    handle = link.sender.start(link.target("r1", [0, 1], layout), random_pool(layout, 8))
    handle.push(0, [4, 5], 0)
    handle.abort()
    handle.abort()
    handle.push(1, [4, 5], 0)  # no-op after abort
    assert handle.state == TransferState.ABORTED
    with pytest.raises(TransferError, match="aborted"):
        handle.finish(timeout=5)
    assert not link.receiver.is_complete("r1")


def test_push_outside_target_blocks_is_a_caller_error(connect) -> None:
    layout = make_layout()
    link = connect(poisoned_pool(layout, 8), layout)
    link.receiver.expect("r1", [0, 1])
    handle = link.sender.start(link.target("r1", [0, 1], layout), random_pool(layout, 8))
    with pytest.raises(ValueError):
        handle.push(0, [4, 5], 1)
    with pytest.raises(ValueError):
        handle.push(layout.num_layers, [4], 0)
    handle.abort()


def test_expect_validates_block_ids(connect) -> None:
    layout = make_layout()
    link = connect(poisoned_pool(layout, 8), layout)
    with pytest.raises(ValueError):
        link.receiver.expect("r1", [8])
    with pytest.raises(ValueError):
        link.receiver.expect("r1", [1, 1])
    link.receiver.expect("r1", [1])
    with pytest.raises(ValueError):
        link.receiver.expect("r1", [2])
