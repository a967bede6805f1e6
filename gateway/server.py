"""The public gRPC face: Generate and ListModels over the shared `gateway.generation` path."""

from __future__ import annotations

import contextlib
import uuid

import grpc
from google.protobuf.message import DecodeError

from gateway.deadline import Deadline
from gateway.errors import GatewayError
from gateway.generation import BadRequest, Generation
from gateway.observe import observed
from gateway.wire_check import bad_field
from pdserve.metrics import GatewayMetrics
from pdserve.proto import gateway_pb2
from pdserve.telemetry import incoming_context


def parse_request(data: bytes) -> gateway_pb2.GenerateRequest | BadRequest:
    """The request, or a BadRequest naming the field whose bytes did not parse."""
    try:
        return gateway_pb2.GenerateRequest.FromString(data)
    except DecodeError:
        return BadRequest(bad_field(data))


class GatewayService:
    """pdserve.v1.Gateway: each GatewayError becomes a status (RESOURCE_EXHAUSTED with `retry-after-ms`)."""

    def __init__(self, generation: Generation, metrics: GatewayMetrics | None = None) -> None:
        self.generation = generation
        self.metrics = metrics

    async def Generate(self, request, context: grpc.aio.ServicerContext):
        """The token stream of one request, inside its `gateway.generate` span and metrics."""
        rid = uuid.uuid4().hex
        await context.send_initial_metadata((("x-request-id", rid),))
        inner = self.generation.stream(request, rid, Deadline(context.time_remaining()))
        model = self.generation.model.name
        try:
            async with contextlib.aclosing(observed(inner, request, model, incoming_context(context),
                                                    self.metrics)) as stream:
                async for resp in stream:
                    yield resp
        except GatewayError as e:
            if e.retry_after_ms is not None:
                context.set_trailing_metadata((("retry-after-ms", str(e.retry_after_ms)),))
            await context.abort(e.code, e.message)

    async def ListModels(self, request, context) -> gateway_pb2.ListModelsResponse:
        model = self.generation.model
        return gateway_pb2.ListModelsResponse(models=[gateway_pb2.ModelInfo(id=model.name,
                                                                            max_model_len=model.max_model_len)])


def add_to_server(service: GatewayService, server: grpc.aio.Server) -> None:
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            service.Generate, request_deserializer=parse_request,
            response_serializer=gateway_pb2.GenerateResponse.SerializeToString),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            service.ListModels, request_deserializer=gateway_pb2.ListModelsRequest.FromString,
            response_serializer=gateway_pb2.ListModelsResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("pdserve.v1.Gateway", handlers),))
