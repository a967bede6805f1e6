"""Python client for the pdserve gateway's gRPC API."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import grpc

from pdserve import api_keys
from pdserve.proto import gateway_pb2, gateway_pb2_grpc
from pdserve.serving import GRPC_OPTIONS

Message = tuple[str, str]


def build_request(
    text: str | None = None, messages: Sequence[Message] | None = None,
    token_ids: Sequence[int] | None = None, model: str = "", priority: int = 0, **sampling: Any,
) -> gateway_pb2.GenerateRequest:
    """A GenerateRequest from one kind of prompt and sampling keywords (temperature=..., stop=[...])."""
    req = gateway_pb2.GenerateRequest(model=model, sampling=gateway_pb2.SamplingParams(**sampling), priority=priority)
    if text is not None:
        req.text = text
    elif messages is not None:
        req.chat.messages.extend(gateway_pb2.ChatMessage(role=r, content=c) for r, c in messages)
    elif token_ids is not None:
        req.token_ids.ids.extend(token_ids)
    return req


def auth_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries api_key (None: PDSERVE_API_KEY, else VLLM_API_KEY, from the
    environment, as the gateway reads its own); () where there is none."""
    value = api_keys.client_authorization(api_key, os.environ)
    return (("authorization", value),) if value else ()


class _Collected:
    """Accumulates a response stream into (text, token ids, Complete)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.ids: list[int] = []
        self.done: gateway_pb2.Complete | None = None

    def add(self, msg: gateway_pb2.GenerateResponse) -> None:
        if msg.HasField("chunk"):
            self.text.append(msg.chunk.text)
            self.ids.extend(msg.chunk.token_ids)
        else:
            self.done = msg.complete

    def result(self) -> tuple[str, list[int], gateway_pb2.Complete]:
        return "".join(self.text), self.ids, self.done


class Client:
    """Blocking client; `generate` yields Chunk messages and returns after the Complete one.
    api_key: sent as `authorization: Bearer <key>` (a gateway with --api-key); None: from the
    environment (PDSERVE_API_KEY, else VLLM_API_KEY), where set."""

    def __init__(self, address: str, api_key: str | None = None) -> None:
        self.metadata = auth_metadata(api_key)
        self.channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)

    def stream(self, request: gateway_pb2.GenerateRequest, timeout: float | None = None) -> Iterator[gateway_pb2.GenerateResponse]:
        return self.stub.Generate(request, timeout=timeout, metadata=self.metadata)

    def generate(self, timeout: float | None = None, **kw: Any) -> tuple[str, list[int], gateway_pb2.Complete]:
        """Whole text, token ids and the Complete message of one request."""
        acc = _Collected()
        for msg in self.stream(build_request(**kw), timeout=timeout):
            acc.add(msg)
        return acc.result()

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """asyncio client; cancel the consuming task (or use a timeout) to abort a request. api_key:
    as Client's."""

    def __init__(self, address: str, own_connection: bool = False, api_key: str | None = None) -> None:
        self.metadata = auth_metadata(api_key)
        # Channels to one address share one connection unless own_connection; a gateway with
        # --num-procs spreads connections, not requests, over its processes.
        local = [("grpc.use_local_subchannel_pool", 1)] if own_connection else []
        self.channel = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS + local)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)

    async def stream(self, request: gateway_pb2.GenerateRequest, timeout: float | None = None) -> AsyncIterator[gateway_pb2.GenerateResponse]:
        async for msg in self.stub.Generate(request, timeout=timeout, metadata=self.metadata):
            yield msg

    async def generate(self, timeout: float | None = None, **kw: Any) -> tuple[str, list[int], gateway_pb2.Complete]:
        acc = _Collected()
        async for msg in self.stream(build_request(**kw), timeout=timeout):
            acc.add(msg)
        return acc.result()

    async def close(self) -> None:
        await self.channel.close()
