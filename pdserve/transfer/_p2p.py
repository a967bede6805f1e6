"""Wire pieces of the nccl backend: fixed-size headers, pair rendezvous keys, process groups.

A pair is one prefill (rank 1) and one decode (rank 0) process with their own process group
(ProcessGroupNCCL for CUDA pools, ProcessGroupGloo for CPU pools, built directly on a
PrefixStore: no default group, no global state). On the pair's group only the prefill sends;
every message is a HEADER_BYTES uint8 header, followed by `data_len` payload bytes when
data_len > 0. Acks go back through the decode worker's TCPStore (never through the group, so a
single NCCL stream per pair cannot deadlock on opposite-direction traffic).
"""

from __future__ import annotations

import enum
import json
import os
import struct
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pdserve.proto import kv_pb2

HEADER_BYTES = 1024
MAX_REQUEST_ID = 512
_MAGIC = b"PDKV"
_FIXED = struct.Struct("<4sBIQ")  # magic, kind, proto length, payload length
DECODE_RANK, PREFILL_RANK = 0, 1


class Kind(enum.IntEnum):
    """What a header announces."""

    CHUNK = 1  # a KvChunk (payload follows unless data_len == 0)
    HEARTBEAT = 2  # keeps the receiver's idle watchdog quiet
    CLOSE = 3  # the sender closes the pair


class PairState(enum.Enum):
    """CONNECTING -> READY -> CLOSED | BROKEN (final)."""

    CONNECTING = "connecting"
    READY = "ready"
    CLOSED = "closed"
    BROKEN = "broken"


def counter_key() -> str:
    return "pdkv/next"


def hello_key(pair: int) -> str:
    return f"pdkv/{pair}/hello"


def reply_key(pair: int) -> str:
    return f"pdkv/{pair}/reply"


def ack_key(pair: int, seq: int) -> str:
    return f"pdkv/{pair}/ack/{seq}"


def group_prefix(pair: int) -> str:
    return f"pdkv/{pair}/pg"


def encode_header(kind: Kind, chunk: kv_pb2.KvChunk | None = None, data_len: int = 0) -> torch.Tensor:
    """A HEADER_BYTES uint8 CPU tensor; `chunk.data` must be empty (the payload is separate)."""
    body = b"" if chunk is None else chunk.SerializeToString()
    raw = _FIXED.pack(_MAGIC, int(kind), len(body), data_len) + body
    if len(raw) > HEADER_BYTES:
        raise ValueError(f"header of {len(raw)} bytes exceeds {HEADER_BYTES}")
    out = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
    out[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return out


def decode_header(header: torch.Tensor) -> tuple[Kind, kv_pb2.KvChunk, int]:
    """Parse a received header; ValueError if it is not one (the pair is then corrupt)."""
    raw = header.cpu().numpy().tobytes()
    magic, kind, body_len, data_len = _FIXED.unpack_from(raw)
    if magic != _MAGIC or body_len > HEADER_BYTES - _FIXED.size:
        raise ValueError("corrupt KV header")
    chunk = kv_pb2.KvChunk.FromString(raw[_FIXED.size : _FIXED.size + body_len])
    if chunk.data:
        raise ValueError("KV header carries inline data")
    return Kind(kind), chunk, data_len


@dataclass(frozen=True)
class Ack:
    """The receiver's verdict on one request: ok with counts, or a gRPC status name."""

    request_id: str
    ok: bool
    bytes: int = 0
    chunks: int = 0
    code: str = ""
    message: str = ""

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Ack:
        fields = json.loads(raw)
        return cls(
            str(fields["request_id"]), bool(fields["ok"]), int(fields["bytes"]),
            int(fields["chunks"]), str(fields["code"]), str(fields["message"]),
        )


def new_group(store: dist.Store, rank: int, device: torch.device, timeout: float) -> dist.Backend:
    """The pair's two-rank backend: NCCL for a CUDA pool, gloo otherwise. Blocks until the
    peer constructs its side (gloo) or until the first operation (NCCL)."""
    if device.type == "cuda":
        # Without this the NCCL watchdog kills the whole worker when a peer dies; with it the
        # communicator is aborted and the pending operation raises (we then drop the pair).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout)
        return dist.ProcessGroupNCCL(store, rank, 2, opts)
    return dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=timeout))


def wait_work(work: dist.Work, device: torch.device, timeout: float) -> None:
    """Wait for a send/recv with a deadline; TimeoutError or RuntimeError when it fails."""
    if device.type != "cuda":
        work.wait(timedelta(seconds=timeout))
        return
    deadline = time.monotonic() + timeout
    pause = 5e-5
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise TimeoutError(f"NCCL operation not complete after {timeout}s")
        time.sleep(pause)
        pause = min(pause * 2, 2e-3)
    work.wait()


def abort_group(group: dist.Backend | None) -> None:
    """Best-effort teardown so that no NCCL operation of the pair stays blocked. Gloo groups
    are left to garbage collection: their operations fail on their own when the socket closes
    or the group timeout passes (abort() on gloo terminates the process at exit)."""
    if group is None or not isinstance(group, getattr(dist, "ProcessGroupNCCL", ())):
        return
    for name in ("abort", "shutdown"):
        fn = getattr(group, name, None)
        if fn is not None:
            try:
                fn()
                return
            except Exception:  # noqa: BLE001 - teardown of a broken pair must not raise
                continue
