"""The real gateway (a process) in front of fake prefill and decode workers (processes), on loopback.

    with FakeStack(interval_ms=20) as stack:
        ...  # stack.gateway is the gateway's host:port
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from pdserve.launch import Proc, Stack, free_port

ROOT = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).with_name("fake_workers.py")


class FakeStack(Stack):
    """pdserve.launch.Stack whose workers are bench/fake_workers.py (tokens every interval_ms)."""

    def __init__(self, interval_ms: float = 20.0, model: str | None = None, echo: bool = False,
                 gateway_args: list[str] | None = None, slots: int = 1, emit_log: str | None = None,
                 gateway_cpus: set[int] | None = None) -> None:
        super().__init__(model=model, gateway_args=gateway_args, echo=echo)
        self.interval_ms, self.slots, self.emit_log = interval_ms, slots, emit_log
        self.gateway_cpus = gateway_cpus

    def preexec(self, name: str):
        """Gateways (and their --num-procs children, which inherit it) run on gateway_cpus only."""
        cpus = self.gateway_cpus
        if cpus and name.startswith("gateway"):
            return lambda: os.sched_setaffinity(0, cpus)
        return None

    def _spawn_workers(self) -> dict[str, Proc]:
        return {role: self._spawn_fake(role) for role in ("prefill", "decode")}

    def _spawn_fake(self, role: str) -> Proc:
        port = free_port()
        cmd = [sys.executable, "-u", str(FAKE), "--role", role, "--port", str(port),
               "--interval-ms", str(self.interval_ms), "--slots", str(self.slots)]
        if self.emit_log and role == "decode":
            cmd += ["--emit-log", self.emit_log]
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=ROOT)
        proc = Proc(f"fake-{role}", f"127.0.0.1:{port}", popen)
        threading.Thread(target=proc.pump, args=(self.echo,), daemon=True).start()
        self.procs[f"fake-{role}"] = proc
        return proc
