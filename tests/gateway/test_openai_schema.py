"""OpenAI bodies -> GenerateRequest: parameters this server does not implement are refused by
name, their do-nothing values are taken as absent (gateway/openai_schema.py)."""

from __future__ import annotations

import grpc
import pytest

from gateway.errors import GatewayError
from gateway.generation import UNKNOWN_MODEL
from gateway.openai_http import error_body
from gateway.openai_schema import MAX_CHOICES, bad, chat_request, completion_requests, samples

CHAT = {"model": "", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize("name, value", [
    ("response_format", {"type": "json_object"}), ("response_format", {"type": "json_schema", "json_schema": {}}),
    ("presence_penalty", 0.5), ("frequency_penalty", -1), ("repetition_penalty", 1.2), ("min_p", 0.1),
    ("logprobs", True), ("logprobs", 0), ("top_logprobs", 2), ("logit_bias", {"50": 100}),
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "required"),
    ("guided_json", {"type": "object"}), ("guided_choice", ["a", "b"]), ("echo", True), ("best_of", 2),
])
def test_unsupported_values_are_refused_by_name(name, value):
    for build, body in ((chat_request, CHAT), (completion_requests, {"model": "", "prompt": "Hi"})):
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
        completion_requests({"model": "", "prompt": "Hi", name: value})
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == name
    assert str(err.value) == f"{name}: out of range, got {value}"


def test_a_long_refused_value_is_abbreviated_in_the_message():
    with pytest.raises(GatewayError) as err:
        chat_request({**CHAT, "tools": [{"type": "function", "function": {"name": "f" * 5000}}] * 50})
    assert len(str(err.value)) < 200


def test_only_an_unknown_model_is_404():
    with pytest.raises(GatewayError) as err:
        completion_requests({"model": 5, "prompt": "Hi"})
    assert error_body(err.value)[0] == 400
    unknown = bad("model", f"{UNKNOWN_MODEL} 'x'; this gateway serves 'y'")
    assert error_body(unknown) == (404, {"error": {"message": unknown.message, "type": "invalid_request_error",
                                                   "param": "model", "code": "model_not_found"}})


def test_prompts_and_n_make_choices_in_openai_order_with_seeds_apart():
    body = {"model": "", "prompt": ["a", [5, 6], "c"], "n": 2, "seed": 2**63 - 1, "max_tokens": 3}
    reqs = samples(body, completion_requests(body))
    assert [r.WhichOneof("input") for r in reqs] == ["text", "text", "token_ids", "token_ids", "text", "text"]
    assert [r.text for r in reqs[::2]] == ["a", "", "c"] and list(reqs[2].token_ids.ids) == [5, 6]
    assert [r.sampling.seed for r in reqs] == [2**63 - 1, 0] * 3  # seed + j, kept below 2^63
    assert all(r.sampling.max_tokens == 3 for r in reqs)
    unseeded = samples({"n": 3}, completion_requests({"prompt": "a"}))
    assert len(unseeded) == 3 and not any(r.sampling.HasField("seed") for r in unseeded)
    assert [r.text for r in completion_requests({"prompt": ["only"]})] == ["only"]  # a batch of one
    assert list(completion_requests({"prompt": [1, 2]})[0].token_ids.ids) == [1, 2]  # ids, not a batch


@pytest.mark.parametrize("body, field", [
    ({"prompt": "a", "n": 0}, "n"), ({"prompt": "a", "n": 1.5}, "n"), ({"prompt": "a", "n": True}, "n"),
    ({"prompt": "a", "n": MAX_CHOICES + 1}, "n"), ({"prompt": ["a"] * 65, "n": 2}, "n"),
    ({"prompt": ["a", 5]}, "prompt"), ({"prompt": ["a", []]}, "prompt[1]"), ({"prompt": []}, "prompt"),
    ({"prompt": ["a"] * (MAX_CHOICES + 1)}, "prompt"),
])
def test_bad_prompts_and_n_are_refused_by_name(body, field):
    with pytest.raises(GatewayError) as err:
        samples(body, completion_requests(body))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == field
