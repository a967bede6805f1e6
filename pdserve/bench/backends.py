"""How one benchmark request is sent and timed: over gRPC to the gateway, or (http_backend.py)
over OpenAI-style HTTP/SSE, which the gateway does not serve yet."""

from __future__ import annotations

import time
from typing import Protocol

import grpc

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.metrics import RequestOutput
from pdserve.client import AsyncClient, build_request
from pdserve.proto import gateway_pb2

BACKENDS = ("grpc", "openai-http")


class Backend(Protocol):
    """Sends one request and times its stream; never raises for a failed request."""

    async def send(self, req: BenchRequest) -> RequestOutput: ...

    async def max_model_len(self) -> int | None: ...

    async def close(self) -> None: ...


class GrpcBackend:
    """pdserve.v1.Gateway/Generate with token-id prompts, greedy sampling and ignore_eos."""

    def __init__(self, address: str, model: str = "", timeout: float | None = None,
                 api_key: str | None = None) -> None:
        self.client = AsyncClient(address, api_key=api_key)
        self.model = model
        self.timeout = timeout

    async def send(self, req: BenchRequest) -> RequestOutput:
        """Times one stream: TTFT at the first chunk with tokens, ITL between chunks, E2EL at the end."""
        out = RequestOutput(prompt_len=req.prompt_len)
        request = build_request(token_ids=req.prompt_ids, model=self.model, max_tokens=req.output_len,
                                temperature=0.0, ignore_eos=True)
        out.start = last = time.perf_counter()
        done: gateway_pb2.Complete | None = None
        try:
            async for msg in self.client.stream(request, timeout=self.timeout):
                now = time.perf_counter()
                if msg.HasField("complete"):
                    done = msg.complete
                elif msg.chunk.token_ids:
                    if out.ttft == 0.0:
                        out.ttft = now - out.start
                    else:
                        out.itl.append(now - last)
                    last = now
            out.latency = time.perf_counter() - out.start
        except grpc.aio.AioRpcError as e:
            out.error = f"{e.code().name}: {e.details()}"
            return out
        return _finish(out, done)

    async def max_model_len(self) -> int | None:
        """The served model's context length (ListModels), or None if the gateway does not say."""
        resp = await self.client.stub.ListModels(gateway_pb2.ListModelsRequest(), timeout=30)
        return resp.models[0].max_model_len if resp.models else None

    async def close(self) -> None:
        await self.client.close()


def _finish(out: RequestOutput, done: gateway_pb2.Complete | None) -> RequestOutput:
    """Success needs a Complete message; token counts come from its usage."""
    if done is None:
        out.error = "stream ended without a Complete message"
        return out
    out.prompt_len = done.usage.prompt_tokens or out.prompt_len
    out.output_len = done.usage.completion_tokens
    out.success = out.output_len > 0
    if not out.success:
        out.error = "no tokens generated"
    return out


def make_backend(name: str, address: str, model: str = "", timeout: float | None = None,
                 api_key: str | None = None) -> Backend:
    """The backend called name (address is host:port for both); api_key None: from the
    environment (PDSERVE_API_KEY, else VLLM_API_KEY), as pdserve.client does."""
    if name == "grpc":
        return GrpcBackend(address, model, timeout, api_key)
    if name == "openai-http":
        from pdserve.bench.http_backend import OpenAIHttpBackend

        return OpenAIHttpBackend(address, model, timeout, api_key)
    raise SystemExit(f"pdserve bench: unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
