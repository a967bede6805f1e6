"""base.py helpers and the backend factory."""

from __future__ import annotations

import pytest

from pdserve.transfer import make_sender
from pdserve.transfer.base import (
    LayoutMismatch,
    TransferError,
    TransferState,
    layout_from_proto,
    layout_to_proto,
)
from pdserve.transfer.loopback import LoopbackKvSender
from pdserve.transfer.tcp import TcpKvSender
from transfer_helpers import make_layout


def test_layout_proto_round_trip_carries_hash() -> None:
    layout = make_layout("bfloat16", tp_rank=1, tp_size=2)
    msg = layout_to_proto(layout)
    assert msg.hash == layout.compat_hash()
    assert layout_from_proto(msg) == layout


def test_layout_mismatch_between_names_both() -> None:
    a, b = make_layout(), make_layout(block_size=16)
    err = LayoutMismatch.between(a, b)
    assert a.describe() in str(err) and b.describe() in str(err)
    assert isinstance(err, TransferError) and not err.retryable


def test_final_states() -> None:
    assert {s for s in TransferState if s.final} == {
        TransferState.DONE, TransferState.FAILED, TransferState.ABORTED
    }


def test_make_sender_backends() -> None:
    layout = make_layout()
    tcp = make_sender("tcp", layout, chunk_bytes=1 << 20)
    assert isinstance(tcp, TcpKvSender)
    tcp.close()
    assert isinstance(make_sender("loopback", layout, receiver_by_address={}), LoopbackKvSender)
    nccl = make_sender("nccl", layout)
    assert type(nccl).__name__ == "NcclKvSender"
    nccl.close()
    ipc = make_sender("cuda_ipc", layout)
    assert type(ipc).__name__ == "CudaIpcKvSender"
    ipc.close()
    with pytest.raises(ValueError, match="unknown"):
        make_sender("carrier-pigeon", layout)
