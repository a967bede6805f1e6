"""A hidden debug knob for failure tests: slow every KV chunk down. Off by default.

`PDSERVE_DEBUG_KV_CHUNK_DELAY_MS=N` (environment of a worker process) makes its senders wait N
ms before each data chunk leaves (on the transport's own thread: the tcp request iterator, the
nccl pair thread; loopback on the caller's), and makes its senders and receivers log one
`kv-debug` line per chunk (`sent`, `applied`, `complete`, with request id and layer). Tests use
it to kill a worker while a transfer is really in flight and to prove from the logs that it
was. Never set it in production: every transfer gets N ms slower per chunk.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pdserve.proto import kv_pb2

ENV = "PDSERVE_DEBUG_KV_CHUNK_DELAY_MS"
log = logging.getLogger("pdserve.transfer.debug")


@dataclass(frozen=True)
class ChunkDebug:
    """The knob's value; `on` is False (and every method a no-op) unless the variable is set."""

    delay_s: float = 0.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ChunkDebug:
        raw = environ.get(ENV, "").strip()
        if not raw:
            return cls()
        try:
            ms = float(raw)
        except ValueError:
            raise ValueError(f"{ENV}: not a number of milliseconds: {raw!r}") from None
        if ms < 0:
            raise ValueError(f"{ENV}: must be >= 0, got {raw!r}")
        return cls(ms / 1000)

    @property
    def on(self) -> bool:
        return self.delay_s > 0

    def before_send(self, chunk: kv_pb2.KvChunk) -> None:
        """Sender side, just before a data chunk goes out: wait, then log it."""
        if not self.on or chunk.last:
            return
        time.sleep(self.delay_s)
        log.info("kv-debug sent request=%s layer=%d blocks=%d", chunk.request_id, chunk.layer,
                 chunk.num_blocks)

    def applied(self, chunk: kv_pb2.KvChunk, total_bytes: int) -> None:
        """Receiver side, after a chunk was validated and written."""
        if not self.on:
            return
        if chunk.last:
            log.info("kv-debug complete request=%s bytes=%d", chunk.request_id, total_bytes)
        else:
            log.info("kv-debug applied request=%s layer=%d bytes=%d", chunk.request_id,
                     chunk.layer, total_bytes)
