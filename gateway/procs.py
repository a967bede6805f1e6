"""`--num-procs N`: N gateway processes on one port, each with its own event loop (like vLLM's
--api-server-count), so the per-token gRPC work of a burst of streams is spread over cores.

The parent binds nothing itself: it checks that the ports are free, starts N children
(`python -m gateway <same flags> --proc-index i`), prints READY once all are READY, and
supervises. Each child binds the gRPC port (and the HTTP port) with SO_REUSEPORT, so the kernel
spreads *connections* (not requests) over the children; a client with one channel talks to one
child. What is per process:
- admission: --max-queued-requests bounds each child (the gateway-wide bound is N x that);
- metrics: child i serves Prometheus on --metrics-port + i and pushes OTLP with
  service.instance.id = <service>-<i> (sum over the children when querying);
- health: every child answers grpc.health.v1 on the shared port;
- router and worker health polling: each child polls the workers itself.
SIGTERM/SIGINT to the parent is forwarded to every child, which drains (--drain-timeout) and
exits; the parent exits when all have, 0 when all exited 0. A child that exits on its own is
not restarted: the parent logs which one and how, drains the others and exits 1, so the
orchestrator (compose restart policy, Kubernetes) restarts one whole gateway. Children ask the
kernel for SIGTERM when the parent dies (PR_SET_PDEATHSIG), so a killed parent leaks none.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("gateway")
PR_SET_PDEATHSIG = 1


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the flag in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-procs", type=positive_int, default=1,
                   help="gateway processes sharing --port (and --http-port) via SO_REUSEPORT, one event loop "
                        "each; per-process: --max-queued-requests, metrics on --metrics-port + i")
    # Set by the parent on its children only.
    p.add_argument("--proc-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--supervisor-pid", type=int, default=None, help=argparse.SUPPRESS)


def check_args(args: argparse.Namespace) -> None:
    if args.num_procs > 1 and args.port == 0:
        raise SystemExit("pdserve gateway: --num-procs > 1 needs a fixed --port (not 0)")
    if args.num_procs > 1 and args.http_port == 0:
        raise SystemExit("pdserve gateway: --num-procs > 1 needs a fixed --http-port (not 0)")


def is_child(args: argparse.Namespace) -> bool:
    return args.proc_index is not None


def child_setup(args: argparse.Namespace) -> None:
    """In a child: die with the parent; metrics on --metrics-port + index."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if args.supervisor_pid is not None and os.getppid() != args.supervisor_pid:
        raise SystemExit("pdserve gateway: the parent exited before this process started")
    if args.metrics_port:
        args.metrics_port += args.proc_index


def ensure_free(host: str, port: int) -> None:
    """Fail now, with the flag's address, when something listens on host:port (the children bind
    with SO_REUSEPORT, which would otherwise silently join another gateway of the same user)."""
    for family, kind, proto, _, addr in socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE):
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine, a listener not
            try:
                s.bind(addr)
            except OSError as e:
                raise SystemExit(f"pdserve gateway: cannot bind {host}:{port}: {e.strerror}") from None
        return


@dataclass
class Child:
    index: int
    popen: subprocess.Popen
    ready: threading.Event = field(default_factory=threading.Event)

    def pump(self) -> None:
        """Forward the child's stdout, holding back its READY line (the parent prints one)."""
        for line in self.popen.stdout:  # type: ignore[union-attr]
            if line.startswith("READY"):
                self.ready.set()
            else:
                sys.stdout.write(line)
                sys.stdout.flush()

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)


def spawn(index: int, argv: list[str], service: str) -> Child:
    cmd = [sys.executable, "-u", "-m", "gateway", *argv, "--num-procs", "1", "--proc-index", str(index),
           "--supervisor-pid", str(os.getpid())]
    attrs = ",".join(a for a in (os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""),
                                 f"service.instance.id={service}-{index}") if a)
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, OTEL_RESOURCE_ATTRIBUTES=attrs))
    child = Child(index, popen)
    threading.Thread(target=child.pump, daemon=True).start()
    return child


def supervise(args: argparse.Namespace, argv: list[str], service: str) -> int:
    """Run --num-procs children until a signal or a child's exit; the exit status of the gateway."""
    ensure_free(args.host, args.port)
    if args.http_port is not None:
        ensure_free(args.host, args.http_port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    children = [spawn(i, argv, service) for i in range(args.num_procs)]
    for c in children:
        log.info("gateway process %d/%d: pid %d", c.index, args.num_procs, c.popen.pid)
    status, announced = 0, False
    while not stop.wait(0.1):
        if not announced and all(c.ready.is_set() for c in children):
            print(f"READY {args.host}:{args.port}", flush=True)
            announced = True
        dead = next((c for c in children if c.popen.poll() is not None), None)
        if dead is not None:
            log.error("gateway process %d (pid %d) exited with status %d%s; stopping the gateway",
                      dead.index, dead.popen.pid, dead.popen.returncode, "" if announced else " before READY")
            status = 1
            break
    return max(status, _stop_all(children, args.drain_timeout + 10.0))


def _stop_all(children: list[Child], timeout: float) -> int:
    """SIGTERM every child, wait up to timeout for all, SIGKILL the rest; 1 when any failed."""
    for c in children:
        c.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    status = 0
    for c in children:
        try:
            c.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("gateway process %d (pid %d) did not exit %.0f s after SIGTERM; killing it",
                      c.index, c.popen.pid, timeout)
            c.popen.kill()
            c.popen.wait()
        status = max(status, 1 if c.popen.returncode not in (0, -signal.SIGTERM) else 0)
    return status
