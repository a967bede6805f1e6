"""gateway.responses_api: a Responses body as a chat body, errors named back, and the output
items and events built from chat deltas."""

from __future__ import annotations

import grpc
import pytest

from gateway.errors import GatewayError, bad
from gateway.openai_schema import chat_request
from gateway.responses_api import Builder, Names, frame, to_chat


def test_input_items_become_chat_messages():
    chat, names = to_chat({"model": "m", "instructions": "Be brief.", "max_output_tokens": 7, "top_k": 3, "input": [
        {"role": "developer", "content": "No lists."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                        {"type": "input_text", "text": "Paris and Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        {"type": "function_call_output", "call_id": "c2", "output": "9 C"}],
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "get_weather"}})
    assert [m["role"] for m in chat["messages"]] == ["system", "system", "user", "assistant", "tool", "tool"]
    assert chat["messages"][2]["content"] == "Weather in Paris and Oslo?"
    assert [c["id"] for c in chat["messages"][3]["tool_calls"]] == ["c1", "c2"]  # parallel calls: one turn
    assert names.messages == ["instructions", "input[0]", "input[1]", "input[3]", "input[5]", "input[6]"]
    assert chat["max_tokens"] == 7 and chat["top_k"] == 3 and chat["model"] == "m"
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}
    assert chat["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    with pytest.raises(GatewayError):  # a named function and a json_schema format both constrain the output
        chat_request(chat)


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"), ({"input": 3}, "input"), ({"input": [{"type": "image"}]}, "input[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0]"),
    ({"input": "x", "instructions": 3}, "instructions"), ({"input": "x", "previous_response_id": "r"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"), ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": "x", "tools": [{"type": "file_search"}]}, "tools[0].type"), ({"input": "x", "tools": {}}, "tools"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs"),
])
def test_bad_bodies_are_refused_naming_the_parameter(body, param):
    with pytest.raises(GatewayError) as err:
        to_chat(body)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == param, str(err.value)


def test_chat_errors_name_the_responses_parameter():
    names = Names()
    names.messages = ["instructions", "input[2]"]
    for chat, ours in (("messages[1].content", "input[2].content"), ("messages[0]", "instructions"),
                       ("max_tokens", "max_output_tokens"), ("response_format.json_schema.schema", "text.format.schema"),
                       ("response_format", "text.format"), ("tools[3].function.parameters", "tools[3].parameters"),
                       ("tool_choice.function.name", "tool_choice.name"), ("temperature", "temperature")):
        e = names.renamed(bad(chat, "is wrong"))
        assert (e.field, str(e)) == (ours, f"{ours}: is wrong")


def test_builder_items_and_events():
    b = Builder(frame("abc", "m", {"input": "x"}, {}))
    events = b.start()
    for d in ({"reasoning": "Think"}, {"reasoning": "ing."}, {"content": "Paris"}, {"content": "."},
              {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
              {"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "g", "arguments": "[]"}}]}):
        events += b.add(d)
    response, end = b.finish("tool_calls", {"input_tokens": 1})
    events += end
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [o["type"] for o in response["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert all(o["status"] == "completed" for o in response["output"]) and response["status"] == "completed"
    assert response["output"][0]["content"][0]["text"] == "Thinking." and response["output"][1]["content"][0]["text"] == "Paris."
    assert [(o["call_id"], o["name"], o["arguments"]) for o in response["output"][2:]] == [("call_1", "f", "{}"), ("call_2", "g", "[]")]
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3]  # each item opened once and closed once, in order
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    cut = Builder(frame("abc", "m", {"input": "x"}, {}))
    cut.add({"content": "Par"})
    assert cut.finish("length", {})[0]["incomplete_details"] == {"reason": "max_output_tokens"}
