"""Tracing setup from flags and OTEL_* env vars, run in fresh interpreters (global providers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import json, sys
from pdserve import telemetry
on = telemetry.setup("pdserve-gateway", sys.argv[1] or None)
with telemetry.tracer().start_as_current_span("outer") as span:
    md = dict(telemetry.outgoing_metadata())
    recording = span.is_recording()
print(json.dumps({"on": on, "enabled": telemetry.tracing_enabled(), "md": md,
                  "interceptors": len(telemetry.client_interceptors()),
                  "recording": recording}))
"""


def run(env: dict[str, str], endpoint: str = "") -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PDSERVE_TRACE"))}
    out = subprocess.run([sys.executable, "-c", SCRIPT, endpoint], env={**clean, **env}, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_off_without_endpoint_or_exporter():
    r = run({})
    assert r == {"on": False, "enabled": False, "md": {}, "interceptors": 0, "recording": False}


def test_file_exporter_service_name_and_traceparent(tmp_path):
    path = tmp_path / "spans.jsonl"
    r = run({"PDSERVE_TRACE_FILE": str(path), "OTEL_SERVICE_NAME": "custom"})
    assert r["on"] and r["enabled"] and r["recording"] and r["interceptors"] == 2
    trace_id = r["md"]["traceparent"].split("-")[1]
    (span,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert span["name"] == "outer" and span["service"] == "custom" and span["trace_id"] == trace_id


def test_flag_endpoint_turns_otlp_on_and_sdk_disabled_wins():
    assert run({}, "http://127.0.0.1:1")["on"]
    assert run({"OTEL_TRACES_EXPORTER": "console"})["on"]
    assert not run({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"})["on"]
