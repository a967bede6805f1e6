"""Structured output through the OpenAI HTTP face, with the official `openai` client: OpenAI's
response_format and vLLM's guided_* parameters reach the workers, whose output follows them; a
guide the gateway cannot compile is a 400 naming the parameter the body used."""

from __future__ import annotations

import json
import re

import pytest

openai = pytest.importorskip("openai")  # a test extra (pyproject.toml); the GPU machine lacks it

from pdserve.launch import Stack, free_port  # noqa: E402
from pdtest.stack import openai_client  # noqa: E402

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def http(default_model_dir):
    """(stack, base_url): gateway with --http-port (as tests/e2e/test_openai_http.py's)."""
    port = free_port()
    with Stack(model=str(default_model_dir), worker_args=["--max-model-len", "512"],
               gateway_args=["--max-model-len", "512", "--http-port", str(port)]) as st:
        yield st, f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def client(http):
    yield from openai_client(*http)


def test_chat_json_schema_gives_an_object_of_that_schema(client):
    r = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Describe a person called Ann, aged 31, as JSON."}],
        max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    c = r.choices[0]
    person = json.loads(c.message.content)
    assert sorted(person) == ["age", "name"] and c.finish_reason == "stop"
    assert isinstance(person["name"], str) and len(person["name"]) <= 20
    assert isinstance(person["age"], int) and not isinstance(person["age"], bool)


def test_completion_guided_choice_is_one_of_them(client):
    r = client.completions.create(model="", prompt="Question: Is the sky blue? Answer yes or no.\nAnswer:",
                                  max_tokens=5, temperature=0, extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"


def test_completion_guided_regex_is_matched_whole(client):
    pattern = "[0-9]{3}-[0-9]{4}"
    r = client.completions.create(model="", prompt="My phone number is", max_tokens=12, temperature=0,
                                  extra_body={"guided_regex": pattern})
    assert re.fullmatch(pattern, r.choices[0].text) and r.choices[0].finish_reason == "stop"


def test_sampled_json_object_is_a_json_object(client):
    """Sampled (the mask applies to every row, not only greedy ones); top_p 0.9 and this seed keep
    the small model's object short enough to close within max_tokens (unguided, it writes a code block)."""
    r = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": 'Write a tiny JSON object with one key "color".'}],
        max_tokens=100, temperature=1.0, top_p=0.9, seed=2, response_format={"type": "json_object"})
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    assert isinstance(json.loads(c.message.content), dict)


@pytest.mark.parametrize("chat, extra, param", [
    (True, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format.json_schema.schema"),
    (False, {"guided_json": {"type": "foo"}}, "guided_json"),
    (False, {"guided_regex": "[0-9"}, "guided_regex"),
    (True, {"structured_outputs": {"grammar": "start: undefined_rule"}}, "structured_outputs.grammar"),
])
def test_a_guide_that_does_not_compile_is_400_naming_the_parameter(client, chat, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        if chat:
            client.chat.completions.create(model="", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                           extra_body=extra)
        else:
            client.completions.create(model="", prompt="Hi", max_tokens=5, extra_body=extra)
    assert err.value.status_code == 400 and err.value.body["param"] == param
    assert err.value.body["message"].startswith(f"{param}: ")
