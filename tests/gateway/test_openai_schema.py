"""OpenAI bodies -> GenerateRequest: parameters this server does not implement are refused by
name, their do-nothing values are taken as absent (gateway/openai_schema.py)."""

from __future__ import annotations

import grpc
import pytest

from gateway.errors import GatewayError
from gateway.generation import UNKNOWN_MODEL
from gateway.openai_http import error_body
from gateway.openai_schema import bad, chat_request, completion_request

CHAT = {"model": "", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize("name, value", [
    ("response_format", {"type": "json_object"}), ("response_format", {"type": "json_schema", "json_schema": {}}),
    ("presence_penalty", 0.5), ("frequency_penalty", -1), ("repetition_penalty", 1.2), ("min_p", 0.1),
    ("logprobs", True), ("logprobs", 0), ("top_logprobs", 2), ("logit_bias", {"50": 100}),
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "required"),
    ("guided_json", {"type": "object"}), ("guided_choice", ["a", "b"]), ("echo", True), ("best_of", 2),
])
def test_unsupported_values_are_refused_by_name(name, value):
    for build, body in ((chat_request, CHAT), (completion_request, {"model": "", "prompt": "Hi"})):
        with pytest.raises(GatewayError) as err:
            build({**body, name: value})
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == name
        assert str(err.value).startswith(f"{name}: ") and "not supported" in str(err.value)


@pytest.mark.parametrize("name, value", [
    ("response_format", {"type": "text"}), ("presence_penalty", 0), ("frequency_penalty", 0.0),
    ("repetition_penalty", 1.0), ("logprobs", False), ("top_logprobs", 0), ("logit_bias", {}), ("tools", []),
    ("tool_choice", "none"), ("echo", False), ("best_of", 1), ("min_p", 0.0), ("logprobs", None),
])
def test_values_that_ask_for_nothing_are_accepted(name, value):
    req = chat_request({**CHAT, name: value, "max_tokens": 7, "temperature": 0.5})
    assert req.sampling.max_tokens == 7 and req.sampling.temperature == 0.5
    assert req.chat.messages[0].content == "Hi"


@pytest.mark.parametrize("name, value", [("seed", -5), ("seed", 2**64), ("top_k", 2**40), ("max_tokens", -2**40)])
def test_integers_outside_the_wire_range_are_refused_by_name(name, value):
    with pytest.raises(GatewayError) as err:
        completion_request({"model": "", "prompt": "Hi", name: value})
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == name
    assert str(err.value) == f"{name}: out of range, got {value}"


def test_a_long_refused_value_is_abbreviated_in_the_message():
    with pytest.raises(GatewayError) as err:
        chat_request({**CHAT, "tools": [{"type": "function", "function": {"name": "f" * 5000}}] * 50})
    assert len(str(err.value)) < 200


def test_only_an_unknown_model_is_404():
    with pytest.raises(GatewayError) as err:
        completion_request({"model": 5, "prompt": "Hi"})
    assert error_body(err.value)[0] == 400
    unknown = bad("model", f"{UNKNOWN_MODEL} 'x'; this gateway serves 'y'")
    assert error_body(unknown) == (404, {"error": {"message": unknown.message, "type": "invalid_request_error",
                                                   "param": "model", "code": "model_not_found"}})
