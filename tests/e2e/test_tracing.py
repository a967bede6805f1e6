"""Three real processes exporting spans to a JSON-lines file: one trace per request, right tree."""

from __future__ import annotations

import json
import math
import urllib.request
from collections import defaultdict

import pytest

from pdserve.launch import Stack, free_port

pytestmark = pytest.mark.slow

OTEL_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER",
             "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED")
CHILDREN = {"router.select": "pdserve-gateway", "decode.reserve": "pdserve-gateway",
            "prefill.queue": "pdserve-prefill", "prefill.forward": "pdserve-prefill",
            "kv.transfer": "pdserve-prefill", "decode.wait_kv": "pdserve-decode",
            "decode.generate": "pdserve-decode"}


@pytest.fixture(scope="module")
def traced(default_model_dir, tmp_path_factory):
    """The stack with PDSERVE_TRACE_FILE set for all three; yields (spans, responses, metrics text)."""
    path = tmp_path_factory.mktemp("trace") / "spans.jsonl"
    mp = pytest.MonkeyPatch()
    for var in OTEL_VARS:
        mp.delenv(var, raising=False)
    mp.setenv("PDSERVE_TRACE_FILE", str(path))
    port = free_port()
    try:
        with Stack(model=str(default_model_dir), worker_args=["--max-model-len", "512"],
                   gateway_args=["--max-model-len", "512", "--metrics-port", str(port)]) as st:
            from pdserve.client import Client

            with Client(st.gateway) as c:
                responses = [c.generate(text="The capital of France is", max_tokens=6, temperature=0.0,
                                        ignore_eos=True, timeout=60),
                             c.generate(text="Once upon a time", max_tokens=3, temperature=0.0,
                                        ignore_eos=True, timeout=60)]
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        mp.undo()
    spans = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    yield spans, responses, metrics


def trace_of(spans: list[dict], request_id: str) -> tuple[dict, list[dict]]:
    """The gateway.generate span of request_id and every span of its trace."""
    roots = [s for s in spans if s["name"] == "gateway.generate"
             and s["attributes"].get("pdserve.request_id") == request_id]
    assert len(roots) == 1, [s["name"] for s in spans]
    return roots[0], [s for s in spans if s["trace_id"] == roots[0]["trace_id"]]


def test_one_trace_across_three_services(traced):
    spans, responses, _ = traced
    _, ids, done = responses[0]
    root, members = trace_of(spans, done.request_id)
    assert root["parent_id"] is None and root["service"] == "pdserve-gateway"
    by_name = defaultdict(list)
    for s in members:
        by_name[s["name"]].append(s)
    assert {s["service"] for s in members} == {"pdserve-gateway", "pdserve-prefill", "pdserve-decode"}
    for name, service in CHILDREN.items():
        assert by_name[name], f"no {name} span in the trace; have {sorted(by_name)}"
        for s in by_name[name]:
            assert s["parent_id"] == root["span_id"], name
            assert s["service"] == service, name
            assert root["start_ns"] <= s["start_ns"] <= s["end_ns"] <= root["end_ns"] + 5_000_000, name
    # The other request's trace is a different one.
    other, _ = trace_of(spans, responses[1][2].request_id)
    assert other["trace_id"] != root["trace_id"]


def test_attributes_match_the_response(traced):
    spans, responses, _ = traced
    _, ids, done = responses[0]
    root, members = trace_of(spans, done.request_id)
    a = root["attributes"]
    assert a["gen_ai.usage.input_tokens"] == done.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == done.usage.completion_tokens == len(ids) == 6
    assert a["gen_ai.request.max_tokens"] == 6 and a["gen_ai.request.temperature"] == 0.0
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["gen_ai.request.model"] and a["pdserve.ttft_ms"] > 0
    kv = next(s for s in members if s["name"] == "kv.transfer")["attributes"]
    assert kv["pdserve.kv.blocks"] == math.ceil(done.usage.prompt_tokens / 16)
    assert kv["pdserve.kv.bytes"] > 0 and kv["pdserve.kv.backend"] == "tcp" and kv["pdserve.kv.gbps"] > 0
    gen = next(s for s in members if s["name"] == "decode.generate")["attributes"]
    assert gen["gen_ai.usage.output_tokens"] == len(ids) - 1  # the first token came from prefill


def test_batched_forward_links_the_requests_it_served(traced):
    spans, responses, _ = traced
    root, members = trace_of(spans, responses[0][2].request_id)
    forwards = [s for s in members if s["name"] == "prefill.forward"]
    for f in forwards:
        assert {"trace_id": root["trace_id"], "span_id": root["span_id"]} in f["links"]
        assert responses[0][2].request_id in f["attributes"]["pdserve.batch.request_ids"]


def test_gateway_metrics_count_every_request(traced):
    _, responses, metrics = traced
    n = len(responses)
    assert f"pdserve:time_to_first_token_seconds_count {float(n)}" in metrics
    assert f"pdserve:e2e_request_latency_seconds_count {float(n)}" in metrics
    itl = 5 + 2  # tokens after the first of each request
    assert f"pdserve:inter_token_latency_seconds_count {float(itl)}" in metrics
