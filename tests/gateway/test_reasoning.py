"""gateway.reasoning and gateway.chat_answer: a thinking model's <think>...</think> apart from its
answer, whole and streamed; and the chat template's options (chat_template_kwargs,
add_generation_prompt, continue_final_message)."""

from __future__ import annotations

import json

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.chat_answer import ChatDeltas, message
from gateway.errors import GatewayError
from gateway.openai_schema import chat_request, include_reasoning, openai_param
from gateway.reasoning import Reasoning, ReasoningStream, for_request, split
from gateway.tokenizer import encode_prompt, load_tokenizer, render_chat, template_variables
from gateway.tools import ToolChoice
from pdserve.core.sampling import ValidationError

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("opened, text, thought, content", [
    (False, "<think>\nabc\n</think>\n\nParis.", "\nabc\n", "Paris."),  # Qwen3 thinking
    (False, "Paris.", None, "Paris."),                                   # Qwen3, enable_thinking false
    (False, "  <think>abc</think>Paris.", "abc", "Paris."),
    (False, "abc</think>Paris.", None, "abc</think>Paris."),             # no opening: not reasoning
    (False, "<think>cut short", "cut short", ""),                         # max_tokens inside the thinking
    (False, "<thi", None, "<thi"),
    (True, "abc\n</think>\n\nParis.", "abc\n", "Paris."),                 # the prompt opened it (R1)
    (True, "<think>abc</think>Paris.", "abc", "Paris."),                  # R1 writing the tag anyway
    (True, "still thinking", "still thinking", ""),
    (True, "</think>Paris.", None, "Paris."),                             # an empty thought
    (True, "a</think>b</think>c", "a", "b</think>c"),                     # the first close ends it
])
def test_split(opened, text, thought, content):
    assert split(Reasoning(opened), text) == (thought, content)


def test_for_request():
    """deepseek_r1 starts inside the reasoning; qwen3 where the prompt ends with <think>; no
    parser, no split."""
    assert for_request(None, "<think>\n", True) is None
    assert for_request("deepseek_r1", "<|Assistant|>", True) == Reasoning(True, True, "open")
    assert for_request("qwen3", "<|im_start|>assistant\n", True) == Reasoning(False, True, "optional")
    assert for_request("qwen3", "<|im_start|>assistant\n<think>\n", False) == Reasoning(True, False, "open")
    for parser in ("qwen3", "deepseek_r1"):  # the template closed it (Qwen3, enable_thinking false)
        assert for_request(parser, "assistant\n<think>\n\n</think>\n\n", True) == Reasoning(False, True, "")


def test_partial_tags_are_held_back():
    s = ReasoningStream(Reasoning(False))
    assert s.feed(" <thi") == []
    assert s.feed("nk>ab") == [{"reasoning": "ab"}]
    assert s.feed("c</th") == [{"reasoning": "c"}]
    assert s.feed("ink>\n") == []      # the newlines after the close tag are not content
    assert s.feed("\nPar") == [{"content": "Par"}]
    assert s.feed("is </") == [{"content": "is </"}]  # after the reasoning nothing is held
    assert s.close() == []


def test_include_reasoning_false_drops_it():
    r = Reasoning(True, include=False)
    assert split(r, "abc</think>Paris.") == (None, "Paris.")
    s = ReasoningStream(r)
    assert s.feed("abc</think>Paris.") == [{"content": "Paris."}] and s.close() == []
    msg, _ = message("abc</think>Paris.", "stop", r, None)
    assert msg == {"role": "assistant", "content": "Paris."}


def test_message_fields():
    msg, finish = message("<think>abc</think>Paris.", "stop", Reasoning(False), None)
    assert msg == {"role": "assistant", "content": "Paris.", "reasoning": "abc", "reasoning_content": "abc"}
    msg, finish = message("abc", "length", Reasoning(True), None)
    assert msg["content"] is None and msg["reasoning"] == "abc" and finish == "length"
    msg, finish = message("<think>Use a tool.</think>\n" + CALL, "stop", Reasoning(False), ToolChoice("auto"))
    assert msg["reasoning"] == "Use a tool." and msg["content"] is None and finish == "tool_calls"
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"]


def _assembled(deltas: list[dict]) -> dict:
    out: dict = {"reasoning": None, "content": None, "calls": []}
    for d in deltas:
        assert d.get("reasoning") == d.get("reasoning_content")
        for key in ("reasoning", "content"):
            if d.get(key):
                out[key] = (out[key] or "") + d[key]
        for c in d.get("tool_calls", []):
            out["calls"].append((c["function"]["name"], c["function"]["arguments"]))
    return out


ANSWERS = ["<think>\nabc\n</think>\n\nParis.", "Paris is <b>big</b>.", "x</think>y", "<think>cut", "",
           "<think>Call it.</think>\n" + CALL, "<think>a</think>Text " + CALL + CALL.replace("Paris", "Oslo"),
           "<think>a</think><tool_call>{broken"]


@given(st.sampled_from(ANSWERS), st.booleans(), st.booleans(), st.booleans(), st.data())
@settings(max_examples=300, deadline=None)
def test_any_chunking_streams_the_whole_answer(answer, opened, include, tools_on, data):
    """Streamed deltas, however the text is cut, assemble to the whole answer's message."""
    reasoning, choice = Reasoning(opened, include), ToolChoice("auto") if tools_on else None
    cuts = sorted(data.draw(st.lists(st.integers(0, len(answer)), max_size=8)))
    pieces = [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)])]
    stream = ChatDeltas(reasoning, choice)
    deltas = [d for p in pieces for d in stream.feed(p)]
    last, finish = stream.close("stop")
    got = _assembled([*deltas, *last])
    whole, whole_finish = message(answer, "stop", reasoning, choice)
    assert got["reasoning"] == whole.get("reasoning")
    assert (got["content"] or None) == (whole["content"] or None)
    assert got["calls"] == [(c["function"]["name"], c["function"]["arguments"]) for c in whole.get("tool_calls", [])]
    assert finish == whole_finish


# ---------------------------------------------------------------- the chat template's options

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if not loop.last or add_generation_prompt %}"
            "</{{ m.role }}>{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>"
            "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def tok(default_model_dir):
    t = load_tokenizer(default_model_dir)
    t.chat_template = TEMPLATE
    return t


def test_template_kwargs_reach_the_template(tok):
    msgs = [("user", "hi")]
    assert render_chat(tok, msgs) == "<user>hi</user><assistant>"
    assert render_chat(tok, msgs, template_kwargs={"enable_thinking": False}) == "<user>hi</user><assistant><think></think>"
    assert render_chat(tok, msgs, add_generation_prompt=False) == "<user>hi"
    ids = encode_prompt(tok, messages=msgs, template_kwargs=template_variables('{"enable_thinking": false}'))
    assert tok.decode(ids) == "<user>hi</user><assistant><think></think>"


def test_template_kwargs_may_use_any_free_name(tok):
    """Names the renderer's own parameters use ("self", "messages" is reserved) are variables."""
    tok_self = render_chat(tok, [("user", "hi")], template_kwargs=template_variables('{"self": 1}'))
    assert tok_self == "<user>hi</user><assistant>"


def test_continue_final_message(tok, default_model_dir):
    msgs = [("user", "Name a city."), ("assistant", "The city is")]
    assert render_chat(tok, msgs, add_generation_prompt=False, continue_final_message=True) == \
        "<user>Name a city.</user><assistant>The city is"
    tok_default = load_tokenizer(default_model_dir)  # SmolLM2's own template closes every turn
    text = render_chat(tok_default, msgs, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nThe city is")
    with pytest.raises(ValidationError) as err:
        render_chat(tok, msgs, continue_final_message=True)  # add_generation_prompt is true by default
    assert err.value.field == "continue_final_message"
    with pytest.raises(ValidationError) as err:
        render_chat(tok, [("user", "x"), ("assistant", " ")], add_generation_prompt=False, continue_final_message=True)
    assert err.value.field == "messages[1].content"


@pytest.mark.parametrize("text, field", [
    ("[1]", "template_kwargs"), ("{x", "template_kwargs"), ('{"tools": []}', "template_kwargs.tools"),
    ('{"add_generation_prompt": false}', "template_kwargs.add_generation_prompt"),
])
def test_bad_template_kwargs_are_refused(text, field):
    with pytest.raises(ValidationError) as err:
        template_variables(text)
    assert err.value.field == field
    assert openai_param("chat." + field).startswith("chat_template_kwargs")


@pytest.mark.parametrize("extra, field", [
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"), ({"add_generation_prompt": "no"}, "add_generation_prompt"),
    ({"continue_final_message": 1}, "continue_final_message"), ({"chat_template": "{{ x }}"}, "chat_template"),
])
def test_bad_chat_options_are_refused_naming_the_field(extra, field):
    with pytest.raises(GatewayError) as err:
        chat_request({"messages": [{"role": "user", "content": "hi"}], **extra})
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == field


def test_chat_options_reach_the_request():
    req = chat_request({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": False},
                        "add_generation_prompt": False, "continue_final_message": True})
    assert json.loads(req.chat.template_kwargs) == {"enable_thinking": False}
    assert req.chat.HasField("add_generation_prompt") and not req.chat.add_generation_prompt
    assert req.chat.continue_final_message
    plain = chat_request({"messages": [{"role": "user", "content": "hi"}]})
    assert not plain.chat.HasField("add_generation_prompt") and plain.chat.template_kwargs == ""
    with pytest.raises(GatewayError) as err:
        include_reasoning({"include_reasoning": "yes"})
    assert err.value.field == "include_reasoning"
    assert include_reasoning({}) is True and include_reasoning({"include_reasoning": False}) is False


def test_reasoning_parser_flag(default_model_dir, capsys):
    from gateway.__main__ import parser

    base = ["--port", "1", "--model", str(default_model_dir), "--decode", "127.0.0.1:1", "--prefill", "127.0.0.1:2"]
    assert parser().parse_args([*base, "--reasoning-parser", "qwen3"]).reasoning_parser == "qwen3"
    assert parser().parse_args(base).reasoning_parser is None
    with pytest.raises(SystemExit):
        parser().parse_args([*base, "--reasoning-parser", "o1"])
    assert "--reasoning-parser" in capsys.readouterr().err
