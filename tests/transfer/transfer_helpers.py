"""Helpers for transfer tests: layouts, pools, a grpc.aio server on its own loop thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.transfer._wire import block_bytes, torch_dtype
from pdserve.transfer.tcp import TCP_GRPC_OPTIONS, TcpKvReceiver

T = TypeVar("T")
POISON = -77.0


def make_layout(dtype: str = "float32", **overrides: Any) -> KvLayout:
    fields: dict[str, Any] = dict(
        model="tiny", num_layers=3, num_kv_heads=2, head_dim=8, block_size=4, dtype=dtype
    )
    fields.update(overrides)
    return KvLayout(**fields)


def random_pool(layout: KvLayout, num_blocks: int) -> torch.Tensor:
    """A fresh random pool (unseeded: every test sees new data)."""
    shape = (layout.num_layers, 2, num_blocks, layout.block_size, layout.num_kv_heads,
             layout.head_dim)
    return torch.randn(shape).to(torch_dtype(layout))


def poisoned_pool(layout: KvLayout, num_blocks: int) -> torch.Tensor:
    pool = random_pool(layout, num_blocks)
    pool.fill_(POISON)
    return pool


def layer_bytes(layout: KvLayout, num_blocks: int) -> int:
    return num_blocks * block_bytes(layout)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


class AioServer:
    """A grpc.aio server with one TcpKvReceiver on 127.0.0.1:<free port>, run on its own
    event-loop thread so sync test code can drive the sync sender against it."""

    def __init__(self, receiver: TcpKvReceiver) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        self.port = self._run(self._start(receiver))
        self.address = f"127.0.0.1:{self.port}"

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _start(self, receiver: TcpKvReceiver) -> int:
        self._server = grpc.aio.server(options=TCP_GRPC_OPTIONS)
        receiver.add_to_server(self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    def stop(self) -> None:
        """Stop the server (active calls are cancelled) and its loop; idempotent."""
        if self._server is None:
            return
        server, self._server = self._server, None
        self._run(server.stop(grace=None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
