"""Bad input gets INVALID_ARGUMENT naming the field, and the services keep serving."""

from __future__ import annotations

import grpc
import pytest

from pdserve.client import build_request
from pdserve.proto import gateway_pb2

pytestmark = pytest.mark.slow

CASES = [
    ("empty text", dict(text=""), "text"),
    ("no input", dict(), "input"),
    ("no messages", dict(messages=[]), "chat.messages"),
    ("bad role", dict(messages=[("robot", "hi")]), "chat.messages[0].role"),
    ("prompt too long", dict(token_ids=[100] * 1100, max_tokens=100), "token_ids"),
    ("prompt too long, no max_tokens", dict(text="hi " * 1500), "text"),
    ("no room for max_tokens", dict(token_ids=[100] * 1000, max_tokens=100), "max_tokens"),
    ("temperature < 0", dict(text="hi", temperature=-0.5), "temperature"),
    ("temperature NaN", dict(text="hi", temperature=float("nan")), "temperature"),
    ("top_p 0", dict(text="hi", top_p=0.0), "top_p"),
    ("top_p > 1", dict(text="hi", top_p=1.5), "top_p"),
    ("top_k < -1", dict(text="hi", top_k=-2), "top_k"),
    ("max_tokens 0", dict(text="hi", max_tokens=0), "max_tokens"),
    ("max_tokens < 0", dict(text="hi", max_tokens=-3), "max_tokens"),
    ("logprobs < 0", dict(text="hi", logprobs=-1), "logprobs"),
    ("logprobs > 20", dict(text="hi", logprobs=21), "logprobs"),
    ("presence_penalty > 2", dict(text="hi", presence_penalty=2.5), "presence_penalty"),
    ("frequency_penalty < -2", dict(text="hi", frequency_penalty=-3.0), "frequency_penalty"),
    ("repetition_penalty 0", dict(text="hi", repetition_penalty=0.0), "repetition_penalty"),
    ("min_p > 1", dict(text="hi", min_p=1.5), "min_p"),
    ("logit_bias id outside the vocabulary", dict(text="hi", logit_bias={10**6: 1.0}), "logit_bias"),
    ("logit_bias > 100", dict(text="hi", logit_bias={5: 150.0}), "logit_bias"),
    ("token id too big", dict(token_ids=[1, 2, 10**9]), "token_ids"),
    ("token id negative", dict(token_ids=[1, -5]), "token_ids"),
    ("unknown model", dict(text="hi", model="gpt-9"), "model"),
]


@pytest.mark.parametrize("name,kw,field", CASES, ids=[c[0] for c in CASES])
def test_invalid_argument_names_field(client, name, kw, field):
    with pytest.raises(grpc.RpcError) as err:
        list(client.stream(build_request(**kw), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field), err.value.details()
    text, _, _ = client.generate(text="Hi", max_tokens=3, temperature=0.0)  # still serving


def _raw_call(address: str, payload: bytes):
    with grpc.insecure_channel(address) as ch:
        call = ch.unary_stream("/pdserve.v1.Gateway/Generate", request_serializer=lambda b: b,
                               response_deserializer=gateway_pb2.GenerateResponse.FromString)
        return list(call(payload, timeout=30))


def _corrupt(request: gateway_pb2.GenerateRequest) -> bytes:
    """Serialize, then turn the UTF-8 of 'é' into an invalid sequence of the same length."""
    data = request.SerializeToString()
    assert data.count("é".encode()) == 1
    return data.replace("é".encode(), b"\xc3\x28")


@pytest.mark.parametrize("field,request_kw", [
    ("text", dict(text="café")),
    ("chat.messages[1].content", dict(messages=[("system", "be brief"), ("user", "café")])),
    ("sampling.stop[1]", dict(text="hi", stop=["a", "é"])),
])
def test_invalid_utf8_names_field(stack, client, field, request_kw):
    payload = _corrupt(build_request(**request_kw))
    with pytest.raises(grpc.RpcError) as err:
        _raw_call(stack.gateway, payload)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field), err.value.details()
    assert client.generate(text="Hi", max_tokens=2, temperature=0.0)[1]


def test_prefill_worker_names_a_bad_sampling_field(stack):
    """A worker called directly (not through the gateway) also answers INVALID_ARGUMENT."""
    from pdserve.proto import worker_pb2, worker_pb2_grpc

    with grpc.insecure_channel(stack.workers["prefill"]) as ch:
        with pytest.raises(grpc.RpcError) as err:
            worker_pb2_grpc.PrefillWorkerStub(ch).Prefill(worker_pb2.PrefillRequest(
                request_id="bad-sampling", prompt_token_ids=[1, 2, 3],
                sampling=worker_pb2.WorkerSampling(temperature=-1.0, top_p=1.0, top_k=-1, max_tokens=4)),
                timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("sampling.temperature"), err.value.details()
