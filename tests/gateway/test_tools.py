"""gateway.tools: OpenAI tools and tool_choice in, tool_calls out (whole and streamed)."""

from __future__ import annotations

import json

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.openai_schema import chat_request, tool_choice
from gateway.tokenizer import encode_prompt, load_tokenizer
from gateway.tools import ToolChoice, ToolStream, guide, message, parse_choice, parse_tools, read_calls
from pdserve.core.sampling import ValidationError

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
CHAT = {"model": "", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, TIME]}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _refused(body: dict, field: str, parser: str | None = "hermes", match: str = "") -> str:
    with pytest.raises(GatewayError) as err:
        req = chat_request(body, parser)
        tool_choice(body, req, parser)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == field, str(err.value)
    assert str(err.value).startswith(field + ": ") and match in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("tools, field", [
    ({"name": "f"}, "tools"), ([{"type": "code_interpreter"}], "tools[0].type"), ([{"type": "function"}], "tools[0].function"),
    ([{"function": {"name": "has space"}}], "tools[0].function.name"), ([WEATHER, WEATHER], "tools[1].function.name"),
    ([{"function": {"name": "f", "parameters": "{}"}}], "tools[0].function.parameters"),
    ([{"function": {"name": "f", "description": 3}}], "tools[0].function.description"),
    ([{"function": {"name": "f", "strict": "yes"}}], "tools[0].function.strict"),
])
def test_bad_tools_are_refused_naming_the_field(tools, field):
    _refused({**CHAT, "tools": tools}, field)


@pytest.mark.parametrize("extra, field, match", [
    ({"tool_choice": "always"}, "tool_choice", "must be"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name", "not one of"),
    ({"tool_choice": {"type": "function"}}, "tool_choice", "must be"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls", "boolean"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", "response_format"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}, "guided_regex": "a+"},
     "tool_choice", "guided_regex"),
])
def test_bad_tool_choice_is_refused_naming_the_field(extra, field, match):
    _refused({**CHAT, **extra}, field, match=match)


def test_auto_needs_a_parser():
    """tools without tool_choice mean "auto": only a gateway with --tool-call-parser can read calls."""
    assert "--tool-call-parser" in _refused(CHAT, "tool_choice", parser=None)
    assert "--tool-call-parser" in _refused({**CHAT, "tool_choice": "auto"}, "tool_choice", parser=None)
    for choice in ("none", "required", {"type": "function", "function": {"name": "get_time"}}):
        body = {**CHAT, "tool_choice": choice}
        tool_choice(body, chat_request(body, None), None)  # no parser needed


def test_the_request_carries_tools_and_the_guide_of_the_choice():
    body = {**CHAT, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    req = chat_request(body, None)
    assert [t.name for t in req.chat.tools] == ["get_weather", "get_time"]
    assert json.loads(req.chat.tools[0].parameters) == WEATHER["function"]["parameters"] and not req.chat.tools[1].parameters
    assert json.loads(req.sampling.structured_output.json_schema) == WEATHER["function"]["parameters"]
    assert tool_choice(body, req, None) == ToolChoice("named", "get_weather")
    for choice in ("none", "auto"):
        body = {**CHAT, "tool_choice": choice}
        req = chat_request(body, "hermes")
        assert not req.sampling.HasField("structured_output")
        assert (tool_choice(body, req, "hermes") is None) == (choice == "none")


@pytest.mark.parametrize("parallel", [True, False])
def test_required_asks_for_an_array_of_calls_of_the_tools(parallel):
    req = chat_request({**CHAT, "tool_choice": "required", "parallel_tool_calls": parallel})
    schema = json.loads(req.sampling.structured_output.json_schema)
    assert schema["type"] == "array" and schema["minItems"] == 1 and ("maxItems" in schema) != parallel
    names = [item["properties"]["name"]["const"] for item in schema["items"]["anyOf"]]
    assert names == ["get_weather", "get_time"]
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == WEATHER["function"]["parameters"]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object"}


def test_the_guides_compile(default_model_dir):
    """Both schemas are ones llguidance accepts (a named tool without parameters: any object)."""
    from pdserve.core.sampling import Guide, GuideKind
    from pdserve.guided import GuideCompiler
    from pdserve.model.spec import ModelSpec

    compiler = GuideCompiler.for_model(default_model_dir, ModelSpec.from_dir(default_model_dir).eos_token_ids)
    tools = parse_tools(CHAT)
    for choice in (ToolChoice("required"), ToolChoice("required", parallel=False), ToolChoice("named", "get_time")):
        compiler.check(Guide(GuideKind.JSON, guide(choice, tools).json_schema))


STRICT = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}


@pytest.mark.parametrize("parser, parallel", [("hermes", True), ("hermes", False), ("llama3_json", True),
                                              ("llama3_json", False), ("mistral", True), ("mistral", False)])
def test_auto_with_strict_tools_constrains_the_calls_only(default_model_dir, parser, parallel):
    """"auto" with a strict tool: free text, and where a call begins (the parser's format) a call
    of one of the tools whose arguments (a strict one's) follow its schema; at most one call
    without parallel calls. Without strict tools "auto" is free."""
    from gateway.tokenizer import load_tokenizer
    from pdserve.core.sampling import Guide, GuideKind
    from pdserve.guided import GuideCompiler
    from pdserve.model.spec import ModelSpec

    body = {**CHAT, "tools": [STRICT, TIME], "parallel_tool_calls": parallel}
    req = chat_request(body, parser)
    assert tool_choice(body, req, parser).strict == {"get_weather"}
    assert not chat_request({**CHAT, "tool_choice": "auto"}, parser).sampling.HasField("structured_output")
    compiler = GuideCompiler.for_model(default_model_dir, ModelSpec.from_dir(default_model_dir).eos_token_ids)
    tok, eos = load_tokenizer(default_model_dir), ModelSpec.from_dir(default_model_dir).eos_token_ids

    def whole(text: str) -> bool:  # the answer may be this text and end
        g = compiler.new(Guide(GuideKind.GRAMMAR, req.sampling.structured_output.grammar))
        ok = all(g.accept(t) for t in tok.encode(text, add_special_tokens=False))
        mask = g.allowed()
        return ok and all(mask[t // 8] >> (t % 8) & 1 for t in eos)

    key = "parameters" if parser == "llama3_json" else "arguments"
    call = lambda args, name="get_weather": json.dumps({"name": name, key: args})  # noqa: E731
    shown = {"hermes": lambda c: f"<tool_call>\n{c}\n</tool_call>", "llama3_json": lambda c: c,
             "mistral": lambda c: f"[TOOL_CALLS][{c}]"}[parser]
    two = {"hermes": shown(call({"city": "Paris"})) + shown(call({"tz": 1}, "get_time")),
           "llama3_json": call({"city": "Paris"}) + "; " + call({"tz": 1}, "get_time"),
           "mistral": f'[{call({"city": "Paris"})}, {call({"tz": 1}, "get_time")}]'}[parser]
    assert whole("Paris is sunny today.") and whole("") and whole(shown(call({"city": "Paris"})))
    assert whole(two) is parallel
    assert not whole(shown(call({"town": "Paris"}))) and not whole(shown(call({}, "nope")))
    with pytest.raises(GatewayError) as err:
        chat_request({**body, "response_format": {"type": "json_object"}}, parser)
    assert err.value.field == "tool_choice" and "strict" in str(err.value)


@pytest.mark.parametrize("text, content, calls", [
    (CALL, None, [("get_weather", {"city": "Paris"})]),
    ("Let me look.\n" + CALL, "Let me look.\n", [("get_weather", {"city": "Paris"})]),
    (CALL + "\n" + CALL.replace("Paris", "Rome"), None, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    ('<tool_call>{"name": "get_time", "arguments": {}}', None, [("get_time", {})]),  # stopped before the close
    ('<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": 1}"}</tool_call>', None, [("get_time", {"tz": 1})]),
])
def test_hermes_calls_are_read(text, content, calls):
    got_content, got = read_calls(ToolChoice("auto"), text)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert [c["index"] for c in got] == list(range(len(calls))) and len({c["id"] for c in got}) == len(got)


@pytest.mark.parametrize("text", ["Paris is sunny.", "<tool_call>{not json}</tool_call>", '<tool_call>["a"]</tool_call>',
                                  '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"name": "f", "arguments": 3}'])
def test_text_without_readable_calls_stays_the_content(text):
    assert read_calls(ToolChoice("auto"), text) is None
    assert message(ToolChoice("auto"), text, "stop") == ({"role": "assistant", "content": text}, "stop")


def test_messages_and_finish_reasons():
    named, finish = message(ToolChoice("named", "get_weather"), '{"city": "Paris"}', "stop")
    assert finish == "stop" and named["content"] is None  # as OpenAI for a forced function
    assert named["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert named["tool_calls"][0]["type"] == "function" and named["tool_calls"][0]["id"].startswith("call_")
    required, finish = message(ToolChoice("required"), '[{"name": "get_time", "parameters": {"tz": "UTC"}}]', "stop")
    assert finish == "tool_calls" and json.loads(required["tool_calls"][0]["function"]["arguments"]) == {"tz": "UTC"}
    cut, finish = message(ToolChoice("required"), '[{"name": "get_ti', "length")
    assert finish == "length" and cut == {"role": "assistant", "content": '[{"name": "get_ti'}
    auto, finish = message(ToolChoice("auto"), "Sure. " + CALL, "stop")
    assert finish == "tool_calls" and auto["content"] == "Sure. " and len(auto["tool_calls"]) == 1


def _streamed(choice: ToolChoice, pieces: list[str], finish: str) -> tuple[str, list[dict], str]:
    """The content and the calls a client assembles from a ToolStream's deltas, and the finish."""
    s, deltas = ToolStream(choice), []
    for p in pieces:
        deltas += s.feed(p)
    last, finish = s.close(finish)
    content, calls = "", {}
    for d in deltas + last:
        content += d.get("content", "")
        for c in d.get("tool_calls", []):
            entry = calls.setdefault(c["index"], {"name": "", "arguments": ""})
            entry["name"] += c.get("function", {}).get("name", "")
            entry["arguments"] += c.get("function", {}).get("arguments", "")
            assert ("id" in c) == (entry is calls[c["index"]] and c.get("type") == "function")
    return content, [calls[i] for i in sorted(calls)], finish


def _whole(choice: ToolChoice, text: str, finish: str) -> tuple[str, list[dict], str]:
    msg, finish = message(choice, text, finish)
    return msg["content"] or "", [c["function"] for c in msg.get("tool_calls", [])], finish


LLAMA = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
MISTRAL = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([("auto", "I will check.\n" + CALL + "\n" + CALL.replace("Paris", "Oslo")), ("auto", "No <tool_ call here"),
                        ("auto", "a < b <tool_call>{bad}</tool_call>"), ("named", '{"city": "Paris"}'),
                        ("required", '[{"name": "get_time", "parameters": {}}]'), ("required", '[{"name"')]
                       + [("llama3_json", t) for t in (" " + LLAMA, LLAMA + "; " + LLAMA.replace("Paris", "Oslo"),
                                                       "<|python_tag|>" + LLAMA, '{"name": "f"', "{not json}",
                                                       "Sure: " + LLAMA, "<|python", "  ")]
                       + [("mistral", t) for t in ("[TOOL_CALLS]" + MISTRAL, " " + MISTRAL, "[1] is a citation.",
                                                   "[TOOL_CALLS][{", "The answer: " + MISTRAL, "[TOOL")]),
       st.lists(st.integers(0, 80), max_size=6), st.sampled_from(["stop", "length"]))
def test_a_streamed_answer_assembles_to_the_whole_one(case, cuts, finish):
    """Whatever the chunking (a tag split across chunks included), the deltas add up to the whole
    answer's content, calls and finish reason."""
    mode, text = case
    choice = ToolChoice("auto", parser=mode) if mode in ("llama3_json", "mistral") else \
        ToolChoice(mode, "get_weather" if mode == "named" else "")
    bounds = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]
    assert _streamed(choice, pieces, finish) == _whole(choice, text, finish)


def test_auto_streams_content_until_a_call_may_begin():
    s = ToolStream(ToolChoice("auto"))
    assert s.feed("Hello <to") == [{"content": "Hello "}]  # "<to" may open a call: held
    assert s.feed("day") == [{"content": "<today"}]
    assert s.feed(" <tool_call>{") == [{"content": " "}]
    assert s.feed('"name": "get_time"}') == []
    deltas, finish = s.close("stop")
    assert finish == "tool_calls" and deltas[0]["tool_calls"][0]["function"]["name"] == "get_time"


def test_the_template_sees_tools_and_earlier_calls(default_model_dir):
    """encode_prompt hands tools and assistant calls to the template in the OpenAI form; the
    shipped ChatML template shows them in the Hermes format the parser reads."""
    from pathlib import Path

    import gateway

    tok = load_tokenizer(default_model_dir)
    tok.chat_template = (Path(gateway.__file__).parent / "templates" / "chatml_tools.jinja").read_text()
    body = {**CHAT, "tool_choice": "none", "messages": [
        {"role": "system", "content": "Be brief."}, *CHAT["messages"],
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]}
    req = chat_request(body)
    text = tok.decode(encode_prompt(tok, messages=req.chat.messages, tools=req.chat.tools))
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou may call functions")
    assert json.dumps(WEATHER) in text and json.dumps(TIME) in text
    assert CALL in text and "<tool_response>\n18 C\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    bad = {**body, "messages": [*body["messages"][:3], {"role": "assistant", "tool_calls": [
        {"id": "c1", "function": {"name": "get_weather", "arguments": "{city"}}]}]}
    with pytest.raises(GatewayError) as err:
        chat_request(bad)
    assert err.value.field == "messages[3].tool_calls[0].function.arguments"
    with pytest.raises(ValidationError) as verr:  # the gRPC face: the gateway checks the text too
        encode_prompt(tok, messages=[{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "name": "f", "arguments": "[1]"}]}])
    assert verr.value.field == "messages[0].tool_calls[0].arguments"


def test_gateway_flags(default_model_dir, tmp_path, capsys):
    """--chat-template replaces the model's template (a missing file stops the gateway, naming
    the flag); --tool-call-parser takes only the parsers there are."""
    from gateway.__main__ import parser, tokenizer

    base = ["--port", "1", "--model", str(default_model_dir), "--decode", "127.0.0.1:1", "--prefill", "127.0.0.1:2"]
    with pytest.raises(SystemExit, match="--chat-template"):
        tokenizer(default_model_dir, parser().parse_args([*base, "--chat-template", str(tmp_path / "no.jinja")]).chat_template)
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    tok = tokenizer(default_model_dir, parser().parse_args([*base, "--chat-template", str(tmp_path / "t.jinja")]).chat_template)
    assert tok.decode(encode_prompt(tok, messages=[("user", "hi")])) == "[hi]"
    assert tokenizer(default_model_dir, None).chat_template == load_tokenizer(default_model_dir).chat_template
    assert parser().parse_args([*base, "--tool-call-parser", "hermes"]).tool_call_parser == "hermes"
    with pytest.raises(SystemExit):
        parser().parse_args([*base, "--tool-call-parser", "pythonic"])
    assert "--tool-call-parser" in capsys.readouterr().err


@pytest.mark.parametrize("text, calls", [
    (LLAMA, [("get_weather", '{"city": "Paris"}')]),
    ("\n<|python_tag|>" + LLAMA + " ;\n" + '{"name": "get_time", "arguments": {}}',
     [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]),
    ('{"name": "f", "parameters": "{\\"a\\": 1}"}', [("f", '{"a": 1}')]),
    ("The weather: " + LLAMA, None), ('{"city": "Paris"}', None), (LLAMA + " and more", None), ("", None),
])
def test_llama3_json_reads_whole_answers_of_calls(text, calls):
    """llama3_json: calls only where the whole answer is JSON calls; anything else is content."""
    choice = parse_choice({"tools": [{"type": "function", "function": {"name": "get_weather"}}]},
                          parse_tools({"tools": [{"type": "function", "function": {"name": "get_weather"}}]}), "llama3_json")
    assert choice == ToolChoice("auto", parser="llama3_json")
    read = read_calls(choice, text)
    if calls is None:
        assert read is None and message(choice, text, "stop") == ({"role": "assistant", "content": text}, "stop")
        return
    assert read[0] is None and [(c["function"]["name"], c["function"]["arguments"]) for c in read[1]] == calls
    assert message(choice, text, "stop")[1] == "tool_calls"


@pytest.mark.parametrize("text, calls", [
    ("[TOOL_CALLS]" + MISTRAL, [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]),
    (" " + MISTRAL, [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]),
    ('[{"name": "f", "arguments": "{\\"a\\": 1}"}]', [("f", '{"a": 1}')]),
    ("[1, 2]", None), ("[]", None), ("The calls: " + MISTRAL, None), ("[TOOL_CALLS][{", None),
])
def test_mistral_reads_whole_answers_of_calls(text, calls):
    choice = ToolChoice("auto", parser="mistral")
    read = read_calls(choice, text)
    if calls is None:
        assert read is None and message(choice, text, "stop") == ({"role": "assistant", "content": text}, "stop")
        return
    assert read[0] is None and [(c["function"]["name"], c["function"]["arguments"]) for c in read[1]] == calls
