"""Fixtures that run the same transfer tests over the tcp, loopback and nccl (gloo on CPU)
backends."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Callable

import grpc
import pytest
import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2, kv_pb2_grpc
from pdserve.transfer._receiver import ReceiverCore
from pdserve.transfer._wire import ChunkRejected
from pdserve.transfer.base import KvSender, KvTargetSpec
from pdserve.transfer.loopback import LoopbackKvReceiver, LoopbackKvSender
from pdserve.transfer.nccl import NcclKvReceiver, NcclKvSender
from pdserve.transfer.tcp import TCP_GRPC_OPTIONS, TcpKvReceiver, TcpKvSender

# The suite runs with --import-mode=importlib: make transfer_helpers.py importable by the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transfer_helpers import AioServer  # noqa: E402


@dataclass
class Link:
    """A receiver, its address and a sender pointed at it."""

    backend: str
    receiver: ReceiverCore
    address: str
    sender: KvSender
    server: AioServer | None = None
    _channels: list[grpc.Channel] = field(default_factory=list)

    def target(self, request_id: str, block_ids: list[int], layout: KvLayout) -> KvTargetSpec:
        return KvTargetSpec(request_id, tuple(block_ids), self.address, layout.compat_hash(),
                            self.backend)

    def deliver(self, *chunks: kv_pb2.KvChunk) -> grpc.StatusCode:
        """Send raw chunks as one stream, bypassing the sender; return the final status."""
        if self.server is None:
            try:
                for chunk in chunks:
                    self.receiver.apply(chunk)
            except ChunkRejected as err:
                return err.code
            return grpc.StatusCode.OK
        channel = grpc.insecure_channel(self.address, options=TCP_GRPC_OPTIONS)
        self._channels.append(channel)
        try:
            kv_pb2_grpc.KvTransferStub(channel).Push(iter(chunks), timeout=10)
        except grpc.RpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    def close(self) -> None:
        self.sender.close()
        for channel in self._channels:
            channel.close()
        if self.server is not None:
            self.server.stop()
        if isinstance(self.receiver, NcclKvReceiver):
            self.receiver.close()


Connect = Callable[..., Link]


@pytest.fixture(params=["tcp", "loopback", "nccl"])
def connect(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """connect(dst_pool, receiver_layout, sender_layout=None, chunk_bytes=4 MiB) -> Link."""
    links: list[Link] = []

    def _connect(
        dst_pool: torch.Tensor,
        receiver_layout: KvLayout,
        sender_layout: KvLayout | None = None,
        chunk_bytes: int = 4 << 20,
    ) -> Link:
        sender_layout = sender_layout or receiver_layout
        if request.param == "tcp":
            receiver = TcpKvReceiver(dst_pool, receiver_layout)
            server = AioServer(receiver)
            sender = TcpKvSender(sender_layout, chunk_bytes)
            link = Link("tcp", receiver, server.address, sender, server)
        elif request.param == "nccl":
            nccl_receiver = NcclKvReceiver(dst_pool, receiver_layout, peer_timeout=10.0)
            nccl_sender = NcclKvSender(sender_layout, chunk_bytes, peer_timeout=10.0)
            link = Link("nccl", nccl_receiver, nccl_receiver.kv_address, nccl_sender)
        else:
            loop_receiver = LoopbackKvReceiver(dst_pool, receiver_layout)
            loop_sender = LoopbackKvSender(sender_layout, {"decode-0": loop_receiver}, chunk_bytes)
            link = Link("loopback", loop_receiver, "decode-0", loop_sender)
        links.append(link)
        return link

    yield _connect
    for link in links:
        link.close()
