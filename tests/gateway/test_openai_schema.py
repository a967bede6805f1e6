"""OpenAI bodies -> GenerateRequest: parameters this server does not implement are refused by
name, their do-nothing values are taken as absent; structured output (response_format, vLLM's guided_*
and structured_outputs); token logprobs as OpenAI JSON (gateway/openai_schema.py)."""

from __future__ import annotations

import json

import grpc
import pytest

from gateway.detokenizer import ByteTable
from gateway.errors import GatewayError
from gateway.generation import UNKNOWN_MODEL
from gateway.openai_http import error_body
from gateway.openai_schema import (MAX_CHOICES, ChoiceLogprobs, TokenText, as_sent, bad, chat_request,
                                   completion_requests, echo, merge_logprobs, samples, sampling,
                                   vllm_prompt_logprobs)
from gateway.tokenizer import load_tokenizer
from pdserve.proto import gateway_pb2

CHAT = {"model": "", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize("name, value, chat_too", [
    ("tools", [{"type": "function", "function": {"name": "f"}}], False), ("tool_choice", "required", False),
    ("functions", [{"name": "f"}], True), ("function_call", {"name": "f"}, True), ("suffix", "end", True),
    ("best_of", 2, True),
])
def test_unsupported_values_are_refused_by_name(name, value, chat_too):
    """Refused on /v1/completions; tools and tool_choice are chat's (gateway.tools)."""
    builds = ((chat_request, CHAT),) if chat_too else ()
    for build, body in (*builds, (completion_requests, {"model": "", "prompt": "Hi"})):
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


def test_echo_only_on_completions():
    assert echo({"echo": True}, chat=False) and not echo({"echo": False}, chat=False) and not echo({}, chat=True)
    assert echo({"echo": True, "logprobs": 0}, chat=False)
    for body, chat in (({"echo": True}, True), ({"echo": "yes"}, False), ({"echo": True, "logprobs": 1}, True)):
        with pytest.raises(GatewayError) as err:
            echo(body, chat)
        assert err.value.field == "echo"


@pytest.mark.parametrize("extra, asked", [
    ({}, None), ({"echo": True}, None), ({"logprobs": 2}, None), ({"echo": False, "logprobs": 2}, None),
    ({"echo": True, "logprobs": 2}, 2), ({"echo": True, "logprobs": 0}, 0),  # echo's tokens carry the prompt's
    ({"prompt_logprobs": 0}, 0), ({"prompt_logprobs": 5}, 5), ({"prompt_logprobs": None}, None),
    ({"echo": True, "logprobs": 1, "prompt_logprobs": 4}, 4), ({"echo": True, "logprobs": 3, "prompt_logprobs": 1}, 3),
])
def test_echo_with_logprobs_and_prompt_logprobs_ask_for_the_prompts(extra, asked):
    s = completion_requests({"model": "", "prompt": "Hi", **extra})[0].sampling
    assert s.HasField("prompt_logprobs") == (asked is not None) and s.prompt_logprobs == (asked or 0)
    chat = chat_request({**CHAT, **{k: v for k, v in extra.items() if k == "prompt_logprobs"}}).sampling
    assert chat.HasField("prompt_logprobs") == ("prompt_logprobs" in extra and extra["prompt_logprobs"] is not None)


@pytest.mark.parametrize("value", [-1, 21, 2**40, 1.5, "2", True, False, [1]])
def test_bad_prompt_logprobs_are_400_naming_it(value):
    for build, body in ((chat_request, CHAT), (completion_requests, {"model": "", "prompt": "Hi"})):
        with pytest.raises(GatewayError) as err:
            build({**body, "prompt_logprobs": value})
        status, error = error_body(err.value)
        assert status == 400 and error["error"]["param"] == "prompt_logprobs"
        assert error["error"]["message"].startswith("prompt_logprobs: ")


def test_prompt_logprobs_are_not_streamed():
    """As vLLM: a streamed answer has no place for them (echo with logprobs streams, by its own path)."""
    for build, body in ((chat_request, CHAT), (completion_requests, {"model": "", "prompt": "Hi"})):
        with pytest.raises(GatewayError) as err:
            build({**body, "prompt_logprobs": 1, "stream": True})
        assert err.value.field == "prompt_logprobs" and "stream" in str(err.value)
    echoed = completion_requests({"prompt": "Hi", "echo": True, "logprobs": 1, "stream": True})[0]
    assert echoed.sampling.prompt_logprobs == 1


def test_penalties_min_p_and_logit_bias_reach_the_sampling_params():
    for build, body in ((chat_request, CHAT), (completion_requests, {"model": "", "prompt": "Hi"})):
        req = build({**body, "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.25,
                     "min_p": 0.125, "logit_bias": {"50": 100, "7": -2.5}})
        req = req if isinstance(req, gateway_pb2.GenerateRequest) else req[0]
        s = req.sampling
        assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.min_p) == (0.5, -1.0, 1.25, 0.125)
        assert dict(s.logit_bias) == {50: 100.0, 7: -2.5}


@pytest.mark.parametrize("name, value", [
    ("frequency_penalty", "lots"), ("min_p", "high"), ("logit_bias", [1, 2]), ("logit_bias", {"x": 1}),
    ("logit_bias", {"5": "up"}), ("logit_bias", {"5": True}), ("logit_bias", {str(2**70): 1}),
])
def test_bad_penalty_min_p_or_logit_bias_is_refused_by_name(name, value):
    with pytest.raises(GatewayError) as err:
        chat_request({**CHAT, name: value})
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == name


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


# ---------------------------------------------------------------- logprobs: parameters


@pytest.mark.parametrize("extra, asked", [
    ({}, None), ({"logprobs": None}, None), ({"logprobs": 0}, 0), ({"logprobs": 5}, 5), ({"logprobs": 20}, 20),
    ({"logprobs": 3, "top_logprobs": 0}, 3),
])
def test_completion_logprobs_ask_for_that_many_alternatives(extra, asked):
    for req in samples({"n": 2}, completion_requests({"model": "", "prompt": ["a", "b"], **extra})):
        assert req.sampling.HasField("logprobs") == (asked is not None)
        assert req.sampling.logprobs == (asked or 0)


@pytest.mark.parametrize("extra, asked", [
    ({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 4}, 4),
    ({"logprobs": True, "top_logprobs": 20}, 20), ({"logprobs": False, "top_logprobs": 0}, None),
    ({"top_logprobs": None}, None),
])
def test_chat_logprobs_are_a_flag_with_top_logprobs_alternatives(extra, asked):
    req = chat_request({**CHAT, **extra})
    assert req.sampling.HasField("logprobs") == (asked is not None) and req.sampling.logprobs == (asked or 0)


@pytest.mark.parametrize("chat, extra, field", [
    (False, {"logprobs": True}, "logprobs"), (False, {"logprobs": False}, "logprobs"),
    (False, {"logprobs": -1}, "logprobs"), (False, {"logprobs": 21}, "logprobs"),
    (False, {"logprobs": 2**40}, "logprobs"), (False, {"logprobs": 1.5}, "logprobs"),
    (False, {"logprobs": "3"}, "logprobs"), (False, {"top_logprobs": 2}, "top_logprobs"),
    (False, {"logprobs": 2, "top_logprobs": 2}, "top_logprobs"),
    (True, {"logprobs": 1}, "logprobs"), (True, {"logprobs": "true"}, "logprobs"),
    (True, {"top_logprobs": 2}, "top_logprobs"), (True, {"logprobs": False, "top_logprobs": 1}, "top_logprobs"),
    (True, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (True, {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    (True, {"logprobs": True, "top_logprobs": True}, "top_logprobs"),
])
def test_bad_logprobs_are_400_naming_the_parameter(chat, extra, field):
    with pytest.raises(GatewayError) as err:
        chat_request({**CHAT, **extra}) if chat else completion_requests({"model": "", "prompt": "Hi", **extra})
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == field
    status, body = error_body(err.value)
    assert status == 400 and body["error"]["param"] == field and body["error"]["message"].startswith(f"{field}: ")


def test_echo_false_goes_with_logprobs():
    assert completion_requests({"prompt": "Hi", "logprobs": 2, "echo": False})[0].sampling.logprobs == 2


# ---------------------------------------------------------------- logprobs: response objects


@pytest.fixture(scope="module")
def words(default_model_dir):
    tok = load_tokenizer(default_model_dir)
    return tok, TokenText(tok, ByteTable.build(tok))


def _chunk(ids: list[int], logprob: float = -0.5, top: int = 2) -> gateway_pb2.Chunk:
    """A gateway chunk with made-up logprobs: token k gets logprob - k, alternatives ids 10.. ."""
    return gateway_pb2.Chunk(token_ids=ids, logprobs=[gateway_pb2.TokenLogprobs(
        logprob=logprob - k, top_token_ids=range(10, 10 + top), top_logprobs=[-0.25] * top) for k in range(len(ids))])


def _builder(chat: bool, words: TokenText, **sampling) -> ChoiceLogprobs:
    req = gateway_pb2.GenerateRequest(sampling=gateway_pb2.SamplingParams(logprobs=2, **sampling))
    return ChoiceLogprobs(chat, req, words, eos_ids=(2,))


def test_completion_logprobs_strings_offsets_and_split_characters(words):
    tok, text = words
    ids = tok.encode(" Hi 刈 there", add_special_tokens=False)
    pieces = [text.piece(t) for t in ids]
    lp = _builder(False, text)
    whole = lp.empty()
    for k in range(0, len(ids), 2):
        merge_logprobs(whole, lp.part(_chunk(ids[k:k + 2])))
    assert whole["token_logprobs"] == [-0.5, -1.5] * (len(ids) // 2) + [-0.5] * (len(ids) % 2)
    strings = []
    for piece in pieces:
        try:
            strings.append(piece.decode())
        except UnicodeDecodeError:  # part of 刈: written byte by byte
            strings.append("bytes:" + "".join(f"\\x{b:02x}" for b in piece))
    assert whole["tokens"] == strings and any(s.startswith("bytes:\\x") for s in strings)
    # each token's text starts after the characters of the tokens before it: a split character counts once done
    assert whole["text_offset"] == [len(b"".join(pieces[:k]).decode(errors="ignore")) for k in range(len(ids))]
    assert whole["text_offset"][-1] == len(" Hi 刈")
    assert whole["top_logprobs"][0] == {text.string(10): -0.25, text.string(11): -0.25}


def test_chat_logprobs_carry_bytes_and_alternatives(words):
    _, text = words
    ids = [100, 101, 102]
    content = _builder(True, text).part(_chunk(ids))["content"]
    assert [c["token"] for c in content] == [text.string(t) for t in ids]
    assert [c["bytes"] for c in content] == [list(text.piece(t)) for t in ids]
    assert [c["logprob"] for c in content] == [-0.5, -1.5, -2.5]
    assert [len(c["top_logprobs"]) for c in content] == [2, 2, 2]
    assert content[0]["top_logprobs"][0] == {"token": text.string(10), "logprob": -0.25,
                                             "bytes": list(text.piece(10))}


@pytest.mark.parametrize("sampling, last, kept", [
    ({}, 2, False),  # EOS ends it: no text, no entry
    ({"ignore_eos": True}, 2, True),  # generated like any token
    ({"min_tokens": 5}, 2, True),  # too early to stop (the worker would not sample it)
    ({"stop_token_ids": [300]}, 300, False), ({}, 300, True),
])
def test_the_token_a_choice_stops_on_has_no_entry(words, sampling, last, kept):
    _, text = words
    for chat in (False, True):
        lp = _builder(chat, text, **sampling)
        first = lp.part(_chunk([100, 101]))
        tail = lp.part(_chunk([102, last]))
        entries = (lambda o: o["content"]) if chat else (lambda o: o["tokens"])
        assert len(entries(first)) == 2 and len(entries(tail)) == (2 if kept else 1)
    assert text.string(2) == "<|im_end|>"  # special tokens are shown by their own text


def test_a_chunk_whose_logprobs_do_not_match_its_tokens_is_an_internal_error(words):
    _, text = words
    with pytest.raises(GatewayError) as err:
        _builder(False, text).part(gateway_pb2.Chunk(token_ids=[5, 6], logprobs=[gateway_pb2.TokenLogprobs()]))
    assert err.value.code == grpc.StatusCode.INTERNAL


def _first(prompt: list[int], top: list[list[tuple[int, float]]], logprobs: list[float]) -> gateway_pb2.Chunk:
    """A first chunk carrying made-up prompt logprobs (one entry per prompt token after the first)."""
    return gateway_pb2.Chunk(prompt_token_ids=prompt, prompt_logprobs=[
        gateway_pb2.TokenLogprobs(logprob=v, top_token_ids=[t for t, _ in alt], top_logprobs=[x for _, x in alt])
        for v, alt in zip(logprobs, top)])


def test_echoed_prompt_entries_come_first_and_offsets_continue_after_its_text(words):
    tok, text = words
    prompt = tok.encode(" Hi 刈 there", add_special_tokens=False) + [2]  # a split character, a special token
    n = len(prompt)
    first = _first(prompt, [[(10, -0.125), (11, -0.25), (12, -0.375)]] * (n - 1), [-1.0 - k for k in range(n - 1)])
    lp = _builder(False, text)  # logprobs=2: the prompt's three alternatives are cut to two
    shown = tok.decode(prompt)
    whole = lp.prompt_part(first, shown)
    assert whole["tokens"] == [text.string(t) for t in prompt]
    assert whole["token_logprobs"] == [None] + [-1.0 - k for k in range(n - 1)]
    assert whole["top_logprobs"][0] is None
    assert whole["top_logprobs"][1:] == [{text.string(10): -0.125, text.string(11): -0.25}] * (n - 1)
    pieces = [text.piece(t) for t in prompt]
    assert whole["text_offset"] == [len(b"".join(pieces[:k]).decode(errors="ignore")) for k in range(n)]
    assert shown.endswith("<|im_end|>") and whole["text_offset"][-1] == len(shown) - len("<|im_end|>")
    merge_logprobs(whole, lp.part(_chunk([100, 101])))
    assert whole["text_offset"][n:] == [len(shown), len(shown) + len(text.piece(100).decode())]
    assert len(whole["tokens"]) == len(whole["token_logprobs"]) == len(whole["top_logprobs"]) == n + 2


def test_a_first_chunk_without_the_prompts_logprobs_is_an_internal_error(words):
    _, text = words
    for chunk in (gateway_pb2.Chunk(token_ids=[5]), _first([5, 6, 7], [[]], [-1.0])):
        with pytest.raises(GatewayError) as err:
            _builder(False, text).prompt_part(chunk, "x")
        assert err.value.code == grpc.StatusCode.INTERNAL
        with pytest.raises(GatewayError):
            vllm_prompt_logprobs(chunk, 2, text)


def test_vllm_prompt_logprobs_list_the_actual_token_then_the_top_ones(words):
    _, text = words
    first = _first([7, 10, 30, 11], [[(10, -0.5), (20, -1.0), (21, -2.0)], [(20, -0.125), (21, -0.25), (22, -0.375)],
                                     [(20, -0.5), (11, -0.75), (22, -0.875)]], [-0.5, float("-inf"), -0.75])
    out = vllm_prompt_logprobs(first, 2, text)
    entry = lambda t, v, r: (str(t), {"logprob": v, "rank": r, "decoded_token": text.string(t)})  # noqa: E731
    assert out[0] is None and len(out) == 4
    assert list(out[1].items()) == [entry(10, -0.5, 1), entry(20, -1.0, 2)]  # the actual token is the top one
    # not among the top: rank unknown (null); -inf as vLLM writes it
    assert list(out[2].items()) == [entry(30, -9999.0, None), entry(20, -0.125, 1), entry(21, -0.25, 2)]
    assert list(out[3].items()) == [entry(11, -0.75, 2), entry(20, -0.5, 1)]
    assert [len(e) for e in vllm_prompt_logprobs(first, 0, text)[1:]] == [1, 1, 1]
    first.prompt_logprobs[1].rank = 5000  # the workers' rank in the whole vocabulary wins
    assert vllm_prompt_logprobs(first, 2, text)[2]["30"]["rank"] == 5000


# ---------------------------------------------------------------- structured output


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def _both(extra: dict) -> list[gateway_pb2.StructuredOutput]:
    """The StructuredOutput of extra on /v1/chat/completions and on /v1/completions."""
    return [chat_request({**CHAT, **extra}).sampling.structured_output,
            completion_requests({"model": "", "prompt": "Hi", **extra})[0].sampling.structured_output]


@pytest.mark.parametrize("extra, kind, value", [
    ({"response_format": {"type": "json_object"}}, "json_object", True),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                                 "strict": True}}}, "json_schema", SCHEMA),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "json_schema", {}),
    ({"guided_json": SCHEMA}, "json_schema", SCHEMA),
    ({"guided_json": json.dumps(SCHEMA)}, "json_schema", SCHEMA),
    ({"guided_regex": "[0-9]{3}-[0-9]{4}"}, "regex", "[0-9]{3}-[0-9]{4}"),
    ({"guided_choice": ["yes", "no"]}, "choice", ["yes", "no"]),
    ({"guided_grammar": 'start: "a"+'}, "grammar", 'start: "a"+'),
    ({"structured_outputs": {"json": SCHEMA}}, "json_schema", SCHEMA),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, "json_schema", SCHEMA),
    ({"structured_outputs": {"regex": "a+b"}}, "regex", "a+b"),
    ({"structured_outputs": {"choice": ["x"]}}, "choice", ["x"]),
    ({"structured_outputs": {"grammar": 'start: "b"'}}, "grammar", 'start: "b"'),
    ({"structured_outputs": {"json_object": True}}, "json_object", True),
    # members left null and options left false (as a client that sends every field does) ask for nothing
    ({"structured_outputs": {"json": None, "regex": "a", "choice": None, "json_object": False,
                             "disable_any_whitespace": False}}, "regex", "a"),
    # a do-nothing value of one parameter goes with another that asks
    ({"response_format": {"type": "text"}, "guided_regex": "b"}, "regex", "b"),
    ({"guided_json": None, "guided_choice": ["a"]}, "choice", ["a"]),
])
def test_each_structured_output_form_fills_its_member(extra, kind, value):
    for so in _both(extra):
        assert so.WhichOneof("kind") == kind
        if kind == "json_schema":
            assert json.loads(so.json_schema) == value
        elif kind == "choice":
            assert list(so.choice.choices) == value
        else:
            assert getattr(so, kind) == value


@pytest.mark.parametrize("extra", [
    {}, {"response_format": {"type": "text"}}, {"response_format": None}, {"guided_json": None},
    {"structured_outputs": {}}, {"structured_outputs": {"json_object": False, "regex": None}},
])
def test_bodies_without_structured_output_leave_it_unset(extra):
    for build, body in ((chat_request, CHAT), (completion_requests, {"model": "", "prompt": "Hi"})):
        req = build({**body, **extra})
        req = req if isinstance(req, gateway_pb2.GenerateRequest) else req[0]
        assert not req.sampling.HasField("structured_output")


@pytest.mark.parametrize("extra, field", [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"guided_json": SCHEMA, "guided_choice": ["a"]}, "guided_choice"),
    ({"guided_regex": "a", "guided_grammar": "start: \"a\""}, "guided_grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "structured_outputs":
      {"regex": "a"}}, "structured_outputs"),
    ({"guided_choice": ["a"], "structured_outputs": {"json_object": True}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json_object": True, "json": SCHEMA}}, "structured_outputs.json"),
])
def test_more_than_one_structured_output_is_refused_naming_the_second(extra, field):
    for build, body in ((chat_request, CHAT), (completion_requests, {"model": "", "prompt": "Hi"})):
        with pytest.raises(GatewayError) as err:
            build({**body, **extra})
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == field
        assert str(err.value).startswith(f"{field}: only one kind of structured output may be given")


@pytest.mark.parametrize("extra, field, words", [
    ({"response_format": {"type": "xml"}}, "response_format.type", "must be one of"),
    ({"response_format": {"type": "structural_tag"}}, "response_format.type", "must be one of"),
    ({"response_format": {}}, "response_format.type", "must be one of"),
    ({"response_format": "json_object"}, "response_format", "must be an object"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "is missing"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}},
     "response_format.json_schema.schema", "JSON object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}},
     "response_format.json_schema.schema", "JSON object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": 5, "schema": {}}}},
     "response_format.json_schema.name", "must be a string"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}},
     "response_format.json_schema.strict", "must be a boolean"),
    ({"guided_choice": []}, "guided_choice", "must be a non-empty list of non-empty strings"),
    ({"guided_choice": ["a", 5]}, "guided_choice", "must be a non-empty list of non-empty strings"),
    ({"guided_choice": ["a", ""]}, "guided_choice", "must be a non-empty list of non-empty strings"),
    ({"guided_choice": "yes"}, "guided_choice", "must be a non-empty list of non-empty strings"),
    ({"guided_json": "{not json"}, "guided_json", "is not valid JSON"),
    ({"guided_json": "[1, 2]"}, "guided_json", "JSON object"),
    ({"guided_json": 5}, "guided_json", "JSON object"),
    ({"guided_regex": ""}, "guided_regex", "non-empty string"),
    ({"guided_regex": ["a"]}, "guided_regex", "non-empty string"),
    ({"guided_grammar": 7}, "guided_grammar", "non-empty string"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice", "only one kind"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "not supported"),
    ({"structured_outputs": {"jsn": {}}}, "structured_outputs.jsn", "not supported"),
    ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs.disable_any_whitespace",
     "not supported"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object", "must be a boolean"),
    ({"structured_outputs": {"regex": False}}, "structured_outputs.regex", "non-empty string"),
    ({"structured_outputs": {"json": "nope"}}, "structured_outputs.json", "is not valid JSON"),
    ({"structured_outputs": ["json"]}, "structured_outputs", "must be an object"),
])
def test_bad_structured_output_is_400_naming_the_field(extra, field, words):
    for build, body in ((chat_request, CHAT), (completion_requests, {"model": "", "prompt": "Hi"})):
        with pytest.raises(GatewayError) as err:
            build({**body, **extra})
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == field
        status, error = error_body(err.value)
        assert status == 400 and error["error"]["param"] == field
        assert error["error"]["message"].startswith(f"{field}: ") and words in error["error"]["message"]


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"guided_json": {"type": "foo"}}, "guided_json"), ({"guided_regex": "(("}, "guided_regex"),
    ({"structured_outputs": {"grammar": "start: x"}}, "structured_outputs.grammar"),
])
def test_a_guide_the_gateway_refuses_names_the_parameter_sent(extra, param):
    """The gateway names its StructuredOutput member (compiling the guide); the HTTP answer names
    the body's parameter that asked for it."""
    body = {**CHAT, **extra}
    kind = chat_request(body).sampling.structured_output.WhichOneof("kind")
    refused = GatewayError(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.structured_output.{kind}: does not compile",
                           field=f"sampling.structured_output.{kind}")
    status, error = error_body(as_sent(refused, body))
    assert status == 400 and error["error"]["param"] == param
    assert error["error"]["message"] == f"{param}: does not compile"
    other = bad("sampling.top_p", "must be in (0, 1], got 2.0")
    assert as_sent(other, body) is other  # other fields keep their own mapping
    assert as_sent(refused, CHAT) is refused  # a body without structured output: nothing to name


@pytest.mark.parametrize("body, param", [
    ({"guided_regex": "a+", "guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
    ({"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
    ({"guided_json": {}, "guided_whitespace_pattern": ""}, "guided_whitespace_pattern"),
    ({"guided_json": {}, "guided_whitespace_pattern": 3}, "guided_whitespace_pattern"),
    ({"structured_outputs": {"json": {}, "whitespace_pattern": " "}, "guided_whitespace_pattern": " "},
     "structured_outputs.whitespace_pattern"),
    ({"guided_json": {"x-guidance": 1}, "guided_whitespace_pattern": " "}, "guided_json"),
])
def test_a_whitespace_pattern_needs_json_output(body, param):
    with pytest.raises(GatewayError) as err:
        sampling(body, chat=True)
    assert err.value.field == param, str(err.value)


def test_priority_reaches_every_request():
    """vLLM's priority: on each prompt's request (completions) and on chat; 0 when absent."""
    assert [r.priority for r in completion_requests({"prompt": ["a", "b"], "priority": -4})] == [-4, -4]
    assert chat_request({"messages": [{"role": "user", "content": "hi"}], "priority": 9}).priority == 9
    assert completion_requests({"prompt": "a"})[0].priority == 0
    for value in ("1", 1.5, True, 2**31):
        with pytest.raises(GatewayError) as err:
            completion_requests({"prompt": "a", "priority": value})
        assert err.value.field == "priority"
