"""Start gateway + prefill + decode (or gateway + one colocated worker) as child processes on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    address: str
    popen: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    def pump(self, echo: bool) -> None:
        for line in self.popen.stdout:  # type: ignore[union-attr]
            self.lines.append(line)
            if line.startswith("READY"):
                self.ready.set()
            if echo:
                sys.stderr.write(f"[{self.name}] {line}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class Stack:
    """A gateway in front of one prefill and one decode worker, all on 127.0.0.1.

    With colocated=True: a gateway in front of one worker ("colocated") that runs both phases.
    """

    def __init__(self, model: str | None = None, worker_args: list[str] | None = None,
                 gateway_args: list[str] | None = None, echo: bool = False,
                 prefill_args: list[str] | None = None, decode_args: list[str] | None = None,
                 colocated: bool = False, num_prefill: int = 1, num_decode: int = 1) -> None:
        self.colocated = colocated
        self.num_prefill = num_prefill
        self.num_decode = num_decode
        self.model_args = ["--model", str(model)] if model else []
        self.worker_args = worker_args or []
        self.prefill_args = prefill_args or []
        self.decode_args = decode_args or []
        self.gateway_args = gateway_args or []
        self.echo = echo
        self.procs: dict[str, Proc] = {}

    @property
    def gateway(self) -> str:
        return self.procs["gateway"].address

    def spawn(self, name: str, module: str, args: list[str], port: int | None = None) -> Proc:
        port = port or free_port()
        cmd = [sys.executable, "-u", "-m", module, "--port", str(port), *self.model_args, *args]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                 cwd=Path(__file__).resolve().parents[1], preexec_fn=self.preexec(name))
        proc = Proc(name, f"127.0.0.1:{port}", popen)
        threading.Thread(target=proc.pump, args=(self.echo,), daemon=True).start()
        self.procs[name] = proc
        return proc

    def preexec(self, name: str) -> Callable[[], None] | None:
        """Run in the child `name` before it starts (benchmarks pin CPUs here); None: nothing."""
        return None

    def start(self, timeout: float = 300.0, gateway_port: int | None = None) -> "Stack":
        try:
            # All start at once: the gateway's channels connect lazily.
            workers = self._spawn_workers()
            pools = [f"--{role}={','.join(w.address for n, w in workers.items() if n.rstrip('0123456789') == role)}"
                     for role in dict.fromkeys(n.rstrip("0123456789") for n in workers)]
            gw = self.spawn("gateway", "gateway", [*pools, *self.gateway_args], port=gateway_port)
            self.wait([*workers.values(), gw], timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn_workers(self) -> dict[str, Proc]:
        if self.colocated:  # a decode worker that also serves Generate; decode_args apply to it
            args = [*self.worker_args, *self.decode_args, "--role", "colocated"]
            return {"colocated": self.spawn("colocated", "decode_service", args)}
        # Names: prefill, prefill2, ... and decode, decode2, ... (the first keeps the plain name).
        procs = {}
        for role, module, count, extra in (("prefill", "prefill_service", self.num_prefill, self.prefill_args),
                                           ("decode", "decode_service", self.num_decode, self.decode_args)):
            for i in range(count):
                name = role if i == 0 else f"{role}{i + 1}"
                procs[name] = self.spawn(name, module, self.worker_args + extra)
        return procs

    @property
    def workers(self) -> dict[str, str]:
        """Worker name (prefill, decode, colocated; prefill2, decode2, ... when several) -> address."""
        return {n: p.address for n, p in self.procs.items() if n != "gateway"}

    def wait(self, procs: list[Proc], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for p in procs:
            while not p.ready.wait(0.2):
                if p.popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{p.name} did not start:\n{''.join(p.lines[-40:])}")

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()

    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
