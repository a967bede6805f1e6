"""KV transfer between prefill and decode workers; see base.py for the contract."""

from __future__ import annotations

from typing import Any

import torch

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

BACKENDS = ("tcp", "nccl", "cuda_ipc", "loopback")


def make_sender(backend: str, layout: KvLayout, **kw: Any) -> KvSender:
    """Build the KvSender of `backend`; keyword arguments go to its constructor (loopback
    needs receiver_by_address=...; nccl takes chunk_bytes, connect_timeout, peer_timeout)."""
    if backend == "tcp":
        from pdserve.transfer.tcp import TcpKvSender

        return TcpKvSender(layout, **kw)
    if backend == "nccl":
        from pdserve.transfer.nccl import NcclKvSender

        return NcclKvSender(layout, **kw)
    if backend == "cuda_ipc":
        from pdserve.transfer.cuda_ipc import CudaIpcKvSender

        return CudaIpcKvSender(layout, **kw)
    if backend == "loopback":
        from pdserve.transfer.loopback import LoopbackKvSender

        return LoopbackKvSender(layout, **kw)
    raise ValueError(f"unknown KV transfer backend {backend!r}; available: {', '.join(BACKENDS)}")


def make_receiver(backend: str, kv_pool: torch.Tensor, layout: KvLayout, **kw: Any) -> KvReceiver:
    """Build the KvReceiver of `backend` over this worker's pool.

    tcp and cuda_ipc receivers are KvTransfer servicers (`add_to_server`); the nccl receiver
    hosts a TCPStore (kw: host, port, peer_timeout) and names it in `kv_address`, which the
    decode worker must advertise in its KvTargets. cuda_ipc raises CudaIpcUnavailable at once
    when the pool is not on CUDA."""
    if backend == "tcp":
        from pdserve.transfer.tcp import TcpKvReceiver

        return TcpKvReceiver(kv_pool, layout, **kw)
    if backend == "nccl":
        from pdserve.transfer.nccl import NcclKvReceiver

        return NcclKvReceiver(kv_pool, layout, **kw)
    if backend == "cuda_ipc":
        from pdserve.transfer.cuda_ipc import CudaIpcKvReceiver

        return CudaIpcKvReceiver(kv_pool, layout, **kw)
    if backend == "loopback":
        from pdserve.transfer.loopback import LoopbackKvReceiver

        return LoopbackKvReceiver(kv_pool, layout, **kw)
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
    "make_receiver",
    "make_sender",
]
