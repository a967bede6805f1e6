"""gateway.sampling_defaults (vLLM's --generation-config) and how sampling_from_request uses it."""

from __future__ import annotations

import json

import pytest

from gateway import sampling_defaults
from gateway.generation import sampling_from_request
from pdserve.proto import gateway_pb2

QWEN = {"bos_token_id": 1, "do_sample": True, "eos_token_id": [2, 3], "repetition_penalty": 1.05,
        "temperature": 0.7, "top_k": 20, "top_p": 0.8, "transformers_version": "4.37.0"}


def _folder(tmp_path, config) -> str:
    (tmp_path / "generation_config.json").write_text(json.dumps(config) if not isinstance(config, str) else config)
    return str(tmp_path)


def test_auto_reads_the_model_folder(tmp_path):
    _folder(tmp_path, QWEN)
    assert sampling_defaults.load("auto", tmp_path) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                                        "repetition_penalty": 1.05}
    assert sampling_defaults.load("vllm", tmp_path) == {}
    assert sampling_defaults.load("auto", tmp_path / "nothing") == {}  # no file: the built-in defaults


def test_a_folder_and_its_fields(tmp_path):
    folder = _folder(tmp_path, {"top_k": 0, "max_new_tokens": 64, "min_p": 0.05, "seed": 3, "temperature": None})
    assert sampling_defaults.load(folder, tmp_path / "model") == {"top_k": -1, "min_p": 0.05, "max_tokens": 64}


@pytest.mark.parametrize("config, why", [
    ({"top_p": 2.0}, "top_p"), ({"temperature": "hot"}, ""), ("[1]", "not a JSON object"), ("{", ""),
    ({"max_new_tokens": 0}, "max_tokens"),
])
def test_a_bad_file_is_refused_naming_it(tmp_path, config, why):
    folder = _folder(tmp_path, config)
    with pytest.raises(ValueError, match="generation_config.json") as err:
        sampling_defaults.load(folder, tmp_path)
    assert why in str(err.value)
    with pytest.raises(ValueError, match="does not exist"):
        sampling_defaults.load(str(tmp_path / "missing"), tmp_path)


def test_unset_fields_take_the_defaults_and_set_ones_win():
    defaults = {"temperature": 0.7, "top_k": 20, "max_tokens": 64}
    unset = sampling_from_request(gateway_pb2.SamplingParams(), defaults)
    assert (unset.temperature, unset.top_k, unset.top_p, unset.max_tokens) == (0.7, 20, 1.0, 16)  # 16: less than 64
    set_ = sampling_from_request(gateway_pb2.SamplingParams(temperature=0.0, top_k=5, max_tokens=100), defaults)
    assert (set_.temperature, set_.top_k, set_.max_tokens) == (0.0, 5, 100)
    assert sampling_from_request(gateway_pb2.SamplingParams(), {"max_tokens": 5}).max_tokens == 5
    assert sampling_from_request(gateway_pb2.SamplingParams()).temperature == 1.0


def test_the_gateway_flag(default_model_dir, tmp_path):
    from gateway.__main__ import build, parser

    base = ["--port", "1", "--model", str(default_model_dir), "--decode", "127.0.0.1:1", "--prefill", "127.0.0.1:2"]
    assert parser().parse_args(base).generation_config == "auto"
    _folder(tmp_path, {"top_p": 7})
    with pytest.raises(SystemExit, match="--generation-config"):
        build(parser().parse_args([*base, "--generation-config", str(tmp_path)]))
