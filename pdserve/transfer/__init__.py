"""KV transfer between prefill and decode workers; see base.py for the contract."""

from __future__ import annotations

from typing import Any

from pdserve.core.kv_layout import KvLayout
from pdserve.transfer.base import (
    KvReceiver,
    KvSender,
    KvTargetSpec,
    LayoutMismatch,
    SendHandle,
    TransferError,
    TransferState,
    TransferStats,
    layout_from_proto,
    layout_to_proto,
)

BACKENDS = ("tcp", "loopback")
_NOT_BUILT = ("cuda_ipc", "nccl")


def make_sender(backend: str, layout: KvLayout, **kw: Any) -> KvSender:
    """Build the KvSender of `backend` ("tcp" or "loopback"); keyword arguments go to its
    constructor (loopback needs receiver_by_address=...)."""
    if backend == "tcp":
        from pdserve.transfer.tcp import TcpKvSender

        return TcpKvSender(layout, **kw)
    if backend == "loopback":
        from pdserve.transfer.loopback import LoopbackKvSender

        return LoopbackKvSender(layout, **kw)
    if backend in _NOT_BUILT:
        raise ValueError(
            f"KV transfer backend {backend!r} is not built yet; available: {', '.join(BACKENDS)}"
        )
    raise ValueError(f"unknown KV transfer backend {backend!r}; available: {', '.join(BACKENDS)}")


__all__ = [
    "BACKENDS",
    "KvReceiver",
    "KvSender",
    "KvTargetSpec",
    "LayoutMismatch",
    "SendHandle",
    "TransferError",
    "TransferState",
    "TransferStats",
    "layout_from_proto",
    "layout_to_proto",
    "make_sender",
]
