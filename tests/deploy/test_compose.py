"""docker-compose.yml checked without a Docker engine: structure, GPUs, CUDA IPC, health, profiles,
and every service command parsed by pdserve's own argument parsers (a mistyped flag fails)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
GPU = {"prefill": "0", "decode": "1"}
STACKS = {"": ("prefill", "decode", "gateway"), "-cpu": ("prefill-cpu", "decode-cpu", "gateway-cpu")}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def interpolate(arg: str) -> str:
    """Compose's ${VAR:-default} with VAR unset: the default (the file's own defaults are tested)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", arg)


def parse(command: list[str]):
    """The service's own parser applied to the command (python -m MODULE ARGS...)."""
    module, *args = command
    return importlib.import_module(f"{module}.__main__").parser().parse_args([interpolate(a) for a in args])


def test_services_and_images(compose):
    services = compose["services"]
    assert {"jaeger", *STACKS[""], *STACKS["-cpu"]} <= set(services)
    assert services["prefill"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert services["prefill-cpu"]["build"]["dockerfile"] == "deploy/Dockerfile.cpu"
    for name in ("deploy/Dockerfile", "deploy/Dockerfile.cpu"):
        text = (ROOT / name).read_text()
        assert "pip install ." in text and text.startswith(("#", "ARG", "FROM"))
    assert "python:3.11-slim" in (ROOT / "deploy/Dockerfile.cpu").read_text()
    jaeger = services["jaeger"]
    assert "jaegertracing/all-in-one" in jaeger["image"] and "16686:16686" in jaeger["ports"]
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_gpu_workers_pin_one_gpu_and_share_ipc_pid(compose, role):
    svc = compose["services"][role]
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": [GPU[role]], "capabilities": ["gpu"]}]
    assert svc["ipc"] == "host" and svc["pid"] == "host"
    args = parse(svc["command"])
    assert args.kv_transfer == "cuda_ipc" and args.host == "0.0.0.0"


@pytest.mark.parametrize("suffix", ["", "-cpu"])
def test_commands_parse_bind_all_and_export_traces(compose, suffix):
    services = compose["services"]
    prefill, decode, gateway = (services[n] for n in STACKS[suffix])
    for svc in (prefill, decode, gateway):
        args = parse(svc["command"])
        assert args.host == "0.0.0.0"
        assert args.otlp_traces_endpoint == "http://jaeger:4317" and args.metrics_port > 0
    p, d, g = (parse(s["command"]) for s in (prefill, decode, gateway))
    assert g.prefill == f"prefill{suffix}:{p.port}" and g.decode == f"decode{suffix}:{d.port}"
    assert d.advertise_host == f"decode{suffix}"
    assert f"{g.port}:{g.port}" in gateway["ports"]
    assert g.http_port and f"{g.http_port}:{g.http_port}" in gateway["ports"]  # the OpenAI face


def test_cpu_profile_runs_everything_on_cpu(compose):
    for name in STACKS["-cpu"]:
        svc = compose["services"][name]
        assert svc["profiles"] == ["cpu"] and "deploy" not in svc
        args = parse(svc["command"])
        if name != "gateway-cpu":
            assert args.device == "cpu" and args.kv_transfer == "tcp"
            assert args.model is None  # the default model


@pytest.mark.parametrize("name", [*STACKS[""], *STACKS["-cpu"]])
def test_health_checks_and_start_order(compose, name):
    services = compose["services"]
    svc = services[name]
    test = svc["healthcheck"]["test"]
    port = parse(svc["command"]).port
    assert test == ["CMD", "python", "-m", "pdserve.healthcheck", f"127.0.0.1:{port}"]
    for dep, cond in svc.get("depends_on", {}).items():
        assert dep in services
        want = "service_started" if dep == "jaeger" else "service_healthy"
        assert cond == {"condition": want}, (name, dep)
    if name.startswith("gateway"):
        suffix = name[len("gateway"):]
        assert {f"prefill{suffix}", f"decode{suffix}"} <= set(svc["depends_on"])


def test_only_the_gateways_take_the_api_key(compose):
    """PDSERVE_API_KEY passes from the host to the gateway (which reads it as --api-key), empty by
    default (no key); the workers, which need none, never see it."""
    for names in STACKS.values():
        for name in names:
            env = compose["services"][name]["environment"]
            assert env["PDSERVE_CACHE"] == "/cache"
            if name.startswith("gateway"):
                assert env["PDSERVE_API_KEY"] == "${PDSERVE_API_KEY:-}" and interpolate(env["PDSERVE_API_KEY"]) == ""
            else:
                assert "PDSERVE_API_KEY" not in env, name
