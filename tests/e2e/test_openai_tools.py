"""Tool calling through the OpenAI HTTP face with the official `openai` client, on a gateway
started with the shipped ChatML tools template and the Hermes parser: a named function and
"required" constrain the output to calls of the request's tools; "auto" reads the calls the model
writes (forced here with a regex, as the small model rarely calls a tool of itself); streamed
answers assemble to the whole ones; earlier calls and tool results render in later turns. A
second gateway has --reasoning-parser qwen3: a <think>...</think> the model writes (forced with a
regex too) is the answer's `reasoning`, apart from its content, and a structured output holds
after it. The chat template's options (add_generation_prompt, continue_final_message,
chat_template_kwargs) shape the prompt; the Responses API answers over the same path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")  # a test extra (pyproject.toml); the GPU machine lacks it

import gateway  # noqa: E402
from pdserve.launch import Stack, free_port  # noqa: E402
from pdtest.stack import openai_client  # noqa: E402

pytestmark = pytest.mark.slow

TEMPLATE = Path(gateway.__file__).parent / "templates" / "chatml_tools.jinja"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                           "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a city", "parameters": CITY}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather"}}


def _served(model_dir, *flags: str):
    """(stack, base_url) of a stack whose gateway has the OpenAI face, the ChatML tools template and flags."""
    port = free_port()
    with Stack(model=str(model_dir), worker_args=["--max-model-len", "1024"],
               gateway_args=["--max-model-len", "1024", "--http-port", str(port), "--chat-template", str(TEMPLATE),
                             *flags]) as st:
        yield st, f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def http(default_model_dir):
    yield from _served(default_model_dir, "--tool-call-parser", "hermes")


@pytest.fixture
def client(http):
    yield from openai_client(*http)


@pytest.fixture(scope="module")
def thinking_http(default_model_dir):
    """A gateway with --reasoning-parser qwen3 (kept apart: with a reasoning parser a constrained
    answer may open a <think>, which this small model, no thinking model, may never close)."""
    yield from _served(default_model_dir, "--reasoning-parser", "qwen3")


@pytest.fixture
def thinking(thinking_http):
    yield from openai_client(*thinking_http)


def ask(client, stream: bool = False, **kw):
    """(content, [(name, arguments)], finish_reason) of a greedy chat answer, whole or streamed."""
    args = dict(model="", messages=ASK, tools=TOOLS, max_tokens=60, temperature=0)
    args.update(kw)
    if not stream:
        c = client.chat.completions.create(**args).choices[0]
        calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
        assert all(t.id.startswith("call_") and t.type == "function" for t in c.message.tool_calls or [])
        return c.message.content, calls, c.finish_reason
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**args, stream=True):
        d = chunk.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            entry = calls.setdefault(t.index, ["", ""])
            entry[0] += t.function.name or ""
            entry[1] += t.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content or None, [tuple(calls[i]) for i in sorted(calls)], finish


def test_a_named_function_gets_its_arguments(client):
    content, calls, finish = ask(client, tool_choice=WEATHER)
    assert content is None and finish == "stop" and [name for name, _ in calls] == ["get_weather"]
    args = json.loads(calls[0][1])
    assert list(args) == ["city"] and isinstance(args["city"], str)
    assert ask(client, stream=True, tool_choice=WEATHER) == (None, calls, "stop")
    # the same prompt and guide asked for as text: the arguments are that text
    plain = client.chat.completions.create(model="", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=60,
                                           temperature=0, extra_body={"guided_json": CITY})
    assert plain.choices[0].message.content == calls[0][1] and not plain.choices[0].message.tool_calls


def test_required_gets_calls_of_the_tools(client):
    content, calls, finish = ask(client, tool_choice="required", parallel_tool_calls=False)
    assert content is None and finish == "tool_calls" and len(calls) == 1
    assert calls[0][0] in ("get_weather", "get_time") and set(json.loads(calls[0][1])) == {"city"}
    assert ask(client, stream=True, tool_choice="required", parallel_tool_calls=False) == (None, calls, "tool_calls")


def test_auto_reads_the_calls_the_model_writes(client):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    forced = {"guided_regex": "Let me check\\. " + call.replace("{", "\\{").replace("}", "\\}")}
    whole = ask(client, tool_choice="auto", extra_body=forced)
    assert whole == ("Let me check. ", [("get_weather", '{"city": "Paris"}')], "tool_calls")
    assert ask(client, stream=True, tool_choice="auto", extra_body=forced) == whole
    content, calls, finish = ask(client, max_tokens=8)  # tools, no tool_choice: "auto"; the model answers in words
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    assert ask(client, max_tokens=8, tools=strict) == (content, calls, finish)  # the grammar allows what it wrote
    assert calls == [] and finish == "length" and content


def test_earlier_calls_and_results_render_in_the_next_turn(client):
    turns = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    r = client.chat.completions.create(model="", messages=turns, tools=TOOLS, tool_choice="none", max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.content and r.usage.prompt_tokens > 150  # the tools and both turns are in
    turns[1]["tool_calls"][0]["function"]["arguments"] = "{city"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="", messages=turns, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert err.value.body["param"] == "messages[1].tool_calls[0].function.arguments"


def test_tool_refusals_name_the_parameter(client):
    for kw, param in (({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
                      ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice")):
        with pytest.raises(openai.BadRequestError) as err:
            ask(client, **kw)
        assert err.value.body["param"] == param
    broken = [TOOLS[0], {"type": "function", "function": {"name": "odd", "parameters": {"type": "foo"}}}]
    with pytest.raises(openai.BadRequestError) as err:  # a schema llguidance refuses, found when compiled
        ask(client, tool_choice={"type": "function", "function": {"name": "odd"}}, **{"tools": broken})
    assert err.value.body["param"] == "tools[1].function.parameters"


def test_each_choice_has_its_own_calls(client):
    """n choices, sampled: each its own call (its own id), streamed or not."""
    kw = dict(model="", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60, temperature=1.0, seed=3, n=3)
    r = client.chat.completions.create(**kw)
    ids = [c.message.tool_calls[0].id for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2] and len(set(ids)) == 3
    assert all(set(json.loads(c.message.tool_calls[0].function.arguments)) == {"city"} for c in r.choices)
    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            for t in c.delta.tool_calls or []:
                streamed[c.index] = streamed.get(c.index, "") + (t.function.arguments or "")
    assert streamed == {c.index: c.message.tool_calls[0].function.arguments for c in r.choices}


CITY_ONLY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
             "additionalProperties": False}
ASK_JSON = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
# A thought, then JSON: the prompt opens a <think> (the assistant's turn begun with it and left
# open), a structured output holds after the reasoning, and a logit bias on "</", "think" and ">"
# steers this small model (no thinking model) to close its thought (greedy: always the same).
OPENED = dict(messages=[*ASK_JSON, {"role": "assistant", "content": "<think>"}], max_tokens=80, extra_body={
    "guided_json": CITY_ONLY, "add_generation_prompt": False, "continue_final_message": True,
    "logit_bias": {"9617": 6, "17400": 10, "46": 5}})


def _thought(client, stream: bool, **kw) -> tuple[str | None, str | None, str]:
    """(reasoning, content, finish_reason) of a greedy chat answer, whole or streamed."""
    args = dict(model="", messages=ASK, max_tokens=60, temperature=0)
    args.update(kw)
    if not stream:
        c = client.chat.completions.create(**args).choices[0]
        extra = c.message.model_extra or {}
        assert extra.get("reasoning") == extra.get("reasoning_content")
        return extra.get("reasoning"), c.message.content, c.finish_reason
    thought, content, finish = None, None, ""
    for chunk in client.chat.completions.create(**args, stream=True):
        d = chunk.choices[0].delta
        extra = d.model_extra or {}
        if extra.get("reasoning"):
            thought = (thought or "") + extra["reasoning"]
        if d.content:
            content = (content or "") + d.content
        finish = chunk.choices[0].finish_reason or finish
    return thought, content, finish


def test_reasoning_is_apart_from_the_content(thinking):
    """The thought is `reasoning`, the JSON after it the content; streamed the same; include_reasoning
    false leaves the thought out; without a <think> there is none."""
    thought, content, finish = _thought(thinking, False, **OPENED)
    assert thought and finish == "stop" and set(json.loads(content)) == {"city"}
    assert _thought(thinking, True, **OPENED) == (thought, content, "stop")
    hidden = {**OPENED, "extra_body": {**OPENED["extra_body"], "include_reasoning": False}}
    assert _thought(thinking, False, **hidden) == (None, content, "stop")
    assert _thought(thinking, True, **hidden) == (None, content, "stop")
    plain = _thought(thinking, False, max_tokens=8)  # no <think>: all content
    assert plain[0] is None and plain[1]
    guided = _thought(thinking, False, messages=ASK_JSON, extra_body={"guided_json": CITY_ONLY})
    assert guided[0] is None and set(json.loads(guided[1])) == {"city"}  # "optional": straight to the JSON


def test_template_options_shape_the_prompt(http, client):
    import urllib.request

    def count(**body) -> int:
        req = urllib.request.Request(http[1].removesuffix("/v1") + "/tokenize", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["count"]

    begun = [*ASK, {"role": "assistant", "content": "The weather in Paris is"}]
    opened = count(messages=begun, add_generation_prompt=False, continue_final_message=True)
    assert opened < count(messages=begun, add_generation_prompt=False) < count(messages=begun)
    r = client.chat.completions.create(model="", messages=begun, max_tokens=4, temperature=0,
                                       extra_body={"add_generation_prompt": False, "continue_final_message": True,
                                                   "chat_template_kwargs": {"unused": 1}})
    assert r.usage.prompt_tokens == opened and r.choices[0].message.content
    for extra, param in (({"continue_final_message": True}, "continue_final_message"),
                         ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
                         ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
                         ({"include_reasoning": "x"}, "include_reasoning")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="", messages=begun, max_tokens=4, extra_body=extra)
        assert err.value.body["param"] == param, err.value.body


# ---------------------------------------------------------------- the Responses API (same gateway)

def test_responses_answer_as_chat_does(client):
    """/v1/responses: the same answer, usage and finish as the chat with those messages; the
    streamed events assemble to the whole response."""
    chat = client.chat.completions.create(model="", messages=[{"role": "system", "content": "Be brief."}, *ASK],
                                          max_tokens=8, temperature=0)
    r = client.responses.create(model="", instructions="Be brief.", input=ASK[0]["content"], max_output_tokens=8,
                                temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == 8
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    parts = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": ASK[0]["content"]}]}]
    events = list(client.responses.create(model="", input=parts, max_output_tokens=8, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text and events[-1].response.usage.output_tokens == 8


def test_responses_function_calls_and_their_outputs(client):
    tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
              "parameters": t["function"]["parameters"]} for t in TOOLS]
    r = client.responses.create(model="", input=ASK, tools=tools, tool_choice={"type": "function", "name": "get_weather"},
                                max_output_tokens=60, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and set(json.loads(calls[0].arguments)) == {"city"}
    streamed = list(client.responses.create(model="", input=ASK, tools=tools, max_output_tokens=60, temperature=0,
                                            tool_choice={"type": "function", "name": "get_weather"}, stream=True))
    assert "".join(e.delta for e in streamed if e.type == "response.function_call_arguments.delta") == calls[0].arguments
    then = client.responses.create(model="", tools=tools, max_output_tokens=8, temperature=0, tool_choice="none", input=[
        *ASK, {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C and sunny"}])
    assert then.output_text and then.usage.input_tokens > r.usage.input_tokens


def test_responses_reasoning_is_its_own_item(thinking):
    kw = dict(model="", input=OPENED["messages"], max_output_tokens=80, temperature=0, extra_body=OPENED["extra_body"])
    r = thinking.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.status == "completed"
    thought, content, _ = _thought(thinking, False, **OPENED)
    assert r.output[0].content[0].text == thought and r.output_text == content
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = list(thinking.responses.create(**kw, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
    assert events[-1].type == "response.completed" and events[-1].response.output_text == r.output_text


def test_responses_refusals_name_the_parameter(client):
    for kw, param in (({"previous_response_id": "resp_1"}, "previous_response_id"),
                      ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
                      ({"max_output_tokens": 0}, "max_output_tokens"),
                      ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
                      ({"input": [{"role": "user", "content": "hi"}, {"role": "user", "content": 3}]}, "input[1].content"),
                      ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
                      ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "foo"}}}},
                       "text.format.schema"),
                      ({"tools": [{"type": "function", "name": "has space"}], "tool_choice": "required"}, "tools[0].name")):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(**{"model": "", "input": "hi", "max_output_tokens": 4, **kw})
        assert err.value.body["param"] == param, err.value.body
