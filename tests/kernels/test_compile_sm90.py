"""Every kernel compiles for sm_90 through Triton's real code generator (CPU machines)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from pdserve.kernels._common import launchable_kernels  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA runs compile the kernels for real")
def test_kernels_compile_for_sm90() -> None:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        pytest.skip("Triton's NVIDIA backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("aot_compile.py")
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert run.stdout.count("ok ") == 58, run.stdout
    compiled = {line.split()[1] for line in run.stdout.splitlines() if line.startswith("ok ")}
    every = {name.split(".")[1] for name in launchable_kernels()}
    assert every <= compiled, f"kernels aot_compile.py does not compile: {sorted(every - compiled)}"
