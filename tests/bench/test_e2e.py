"""`pdserve bench` end to end on loopback: the real gateway in front of fake workers, and (slow) a
real CPU cluster with the default model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["date", "backend", "dataset_name", "num_prompts", "request_rate", "duration", "completed", "failed",
        "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
        "output_throughput", "total_token_throughput", "goodput_slos_ms", "requests"]


def _bench(address: str, tmp: Path, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "pdserve.cli", "bench", "--address", address, "--save-result", "--save-detailed",
           "--result-dir", str(tmp), "--result-filename", "out.json", "--disable-tqdm", "--seed", "1",
           "--goodput", "ttft:60000", "tpot:60000", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Serving Benchmark Result" in r.stdout
    return json.loads((tmp / "out.json").read_text())


def _check(doc: dict, n: int) -> None:
    missing = [k for k in KEYS if k not in doc]
    missing += [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p90", "p99")
                if f"{s}_{m}_ms" not in doc]
    assert not missing, missing
    assert (doc["completed"], doc["failed"]) == (n, 0)
    assert doc["request_goodput"] == pytest.approx(doc["request_throughput"])  # SLOs of a minute: all good
    assert len(doc["requests"]) == n
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < doc[f"p50_{m}_ms"] <= doc[f"p90_{m}_ms"] <= doc[f"p99_{m}_ms"]
    assert doc["p99_ttft_ms"] <= doc["p99_e2el_ms"]


def test_bench_against_gateway_and_fake_workers(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from fake_stack import FakeStack

    with FakeStack(interval_ms=5) as stack:
        doc = _bench(stack.gateway, tmp_path, "--num-prompts", "20", "--num-warmups", "2", "--input-len", "32",
                     "--output-len", "12", "--range-ratio", "0.5", "--request-rate", "200", "--max-concurrency", "8")
    _check(doc, 20)
    assert all(6 <= r["output_len"] <= 18 and r["success"] for r in doc["requests"])  # ignore_eos: exact lengths
    assert doc["total_output_tokens"] == sum(r["output_len"] for r in doc["requests"])


@pytest.mark.slow
def test_bench_against_real_cpu_cluster(tmp_path: Path, default_model_dir: Path) -> None:
    from pdserve.launch import Stack

    with Stack(model=str(default_model_dir), worker_args=["--max-num-seqs", "8"]) as stack:
        doc = _bench(stack.gateway, tmp_path, "--num-prompts", "6", "--input-len", "16", "--output-len", "6",
                     "--dataset-name", "shared-prefix", "--prefix-len", "32", "--request-rate", "20",
                     "--vocab-size", "49152")
    _check(doc, 6)
    assert doc["total_output_tokens"] == 36


def test_openai_http_backend_names_a_missing_http_face() -> None:
    from pdserve.launch import free_port

    r = subprocess.run([sys.executable, "-m", "pdserve.cli", "bench", "--backend", "openai-http",
                        "--address", f"127.0.0.1:{free_port()}"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0 and "no OpenAI HTTP server at" in r.stderr and "--http-port" in r.stderr
