"""Structured output through gateway + prefill + decode (three processes, KV over tcp): the
prefill worker masks the first token, the decode worker replays it into its own guide and masks
the rest; greedy outputs equal the single-process engine's, and a bad guide is refused by the
gateway naming the field, before any worker sees it."""

from __future__ import annotations

import json
import re

import grpc
import pytest

from pdserve.core.sampling import Guide, GuideKind, SamplingParams
from pdserve.guided import GuideCompiler
from pdserve.proto import gateway_pb2
from pdserve.runtime.offline import generate

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                           "founded": {"type": "integer", "minimum": 0, "maximum": 2100}},
          "required": ["city", "founded"], "additionalProperties": False}
ASK = [("user", "Describe the biggest city of France as JSON.")]


def so(**kind) -> gateway_pb2.StructuredOutput:
    return gateway_pb2.StructuredOutput(**kind)


def test_json_schema_greedy_equals_the_single_process_engine(client, offline_runner, default_model_dir):
    text, ids, done = client.generate(messages=ASK, max_tokens=48, temperature=0.0,
                                      structured_output=so(json_schema=json.dumps(SCHEMA)))
    assert done.finish_reason == gateway_pb2.FINISH_REASON_STOP, text
    obj = json.loads(text)
    assert set(obj) == {"city", "founded"} and 0 <= obj["founded"] <= 2100
    from gateway.tokenizer import encode_prompt, load_tokenizer

    prompt = encode_prompt(load_tokenizer(default_model_dir), messages=ASK)
    eos = offline_runner.spec.eos_token_ids
    params = SamplingParams(temperature=0.0, max_tokens=48, guide=Guide(GuideKind.JSON, json.dumps(SCHEMA)))
    assert ids == generate(offline_runner, [prompt], params, eos, GuideCompiler.for_model(default_model_dir, eos))[0]


def test_choice_regex_grammar_and_json_object_sampled(client):
    text, _, done = client.generate(messages=[("user", "Is Paris in France?")], max_tokens=8, temperature=1.0,
                                    seed=1, structured_output=so(choice=gateway_pb2.Choices(choices=["yes", "no"])))
    assert text in ("yes", "no") and done.finish_reason == gateway_pb2.FINISH_REASON_STOP
    text, _, done = client.generate(text="My phone number is", max_tokens=16, temperature=1.0, seed=2,
                                    structured_output=so(regex=r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"))
    assert re.fullmatch(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", text), text
    text, _, done = client.generate(text="Count:", max_tokens=16, temperature=1.0, seed=3,
                                    structured_output=so(grammar='start: num (", " num)~2\nnum: /[1-9][0-9]?/'))
    assert re.fullmatch(r"[1-9][0-9]?(, [1-9][0-9]?){2}", text), text
    text, _, done = client.generate(messages=ASK, max_tokens=64, temperature=0.7, seed=4,
                                    structured_output=so(json_schema=json.dumps(
                                        {"type": "object", "maxProperties": 2,
                                         "additionalProperties": {"type": "integer"}})))
    assert done.finish_reason == gateway_pb2.FINISH_REASON_STOP, text
    assert all(isinstance(v, int) for v in json.loads(text).values())


def test_json_object_is_any_object(client, offline_runner, default_model_dir):
    """json_object: the tokens of the schema {"type": "object"} (the output is still an open
    object at 24 tokens: compared with the single-process engine, not parsed)."""
    _, ids, _ = client.generate(messages=ASK, max_tokens=24, temperature=0.0, structured_output=so(json_object=True))
    from gateway.tokenizer import encode_prompt, load_tokenizer

    prompt = encode_prompt(load_tokenizer(default_model_dir), messages=ASK)
    eos = offline_runner.spec.eos_token_ids
    params = SamplingParams(temperature=0.0, max_tokens=24, guide=Guide(GuideKind.JSON, '{"type": "object"}'))
    assert ids == generate(offline_runner, [prompt], params, eos, GuideCompiler.for_model(default_model_dir, eos))[0]
    assert ids != generate(offline_runner, [prompt], SamplingParams(temperature=0.0, max_tokens=24), eos)[0]


@pytest.mark.parametrize("kind, why", [
    (dict(json_schema='{"type": "foo"}'), "json does not compile"),
    (dict(json_schema="[1]"), "must be an object"),
    (dict(regex="(unclosed"), "regex does not compile"),
    (dict(grammar="start: missing_rule"), "grammar does not compile"),
    (dict(choice=gateway_pb2.Choices(choices=[])), "non-empty list"),
])
def test_a_bad_guide_is_refused_naming_the_field(client, kind, why):
    with pytest.raises(grpc.RpcError) as err:
        client.generate(text="hi", max_tokens=4, structured_output=so(**kind))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    field = next(iter(kind))
    assert err.value.details().startswith(f"sampling.structured_output.{field}:"), err.value.details()
    assert why in err.value.details()


def test_min_tokens_with_a_guide_is_refused(client):
    with pytest.raises(grpc.RpcError) as err:
        client.generate(text="hi", max_tokens=4, min_tokens=2, structured_output=so(regex="a+"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_tokens" in err.value.details()


def test_the_cli_asks_for_structured_output(stack, tmp_path):
    """`pdserve generate --choice ... / --json-schema @file` against the stack."""
    import subprocess
    import sys

    def cli(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "pdserve.cli", "generate", "--address", stack.gateway, *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    got = cli("--chat", "--choice", "yes", "--choice", "no", "Is Paris in France?")
    text, finish = got.rsplit("\n[finish=", 1)
    assert text in ("yes", "no") and finish.startswith("stop")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    got = cli("--chat", "--max-tokens", "48", "--json-schema", f"@{schema}", "Describe the biggest city of France as JSON.")
    text, finish = got.rsplit("\n[finish=", 1)
    assert set(json.loads(text)) == {"city", "founded"} and finish.startswith("stop")
    bad = subprocess.run([sys.executable, "-m", "pdserve.cli", "generate", "--address", stack.gateway,
                          "--regex", "(", "hi"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "sampling.structured_output.regex" in bad.stderr
