"""The KV transfer contract: a prefill worker's KvSender pushes a request's KV, layer by layer,
into blocks a decode worker's KvReceiver reserved for it.

Every backend (tcp, loopback, cuda_ipc, nccl) implements these interfaces with the same
semantics, so services and tests never depend on the wire underneath.

Ordering after an abort: a block is never written after the decode side has freed it. Backends
whose receiver writes the pool itself (tcp, nccl, loopback) guarantee it inside forget(); a
backend whose sender writes the peer's pool directly (cuda_ipc) attaches to the reservation
before its first write, stops and synchronises its copies when it fails, is aborted or is told
that the request was forgotten, and only then releases it (see KvReceiver.forget).

Debugging: PDSERVE_DEBUG_KV_CHUNK_DELAY_MS slows every chunk down and logs it (_debug.py).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.proto import kv_pb2

#: Called by a receiver once a request's final chunk is written and visible.
CompletionCallback = Callable[[str], None]


class TransferState(enum.Enum):
    """Life of one SendHandle: PENDING -> SENDING -> DONE | FAILED | ABORTED.

    PENDING: started, nothing pushed yet. SENDING: at least one push. DONE: the receiver
    acknowledged every byte. FAILED: a transport or receiver error (finish raises it).
    ABORTED: abort() was called locally. DONE, FAILED and ABORTED are final.
    """

    PENDING = "pending"
    SENDING = "sending"
    DONE = "done"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def final(self) -> bool:
        return self in (TransferState.DONE, TransferState.FAILED, TransferState.ABORTED)


class TransferError(Exception):
    """A transfer failed. `retryable` is True when a fresh attempt may succeed (peer
    unavailable, deadline exceeded); `code` is the gRPC status name when one was involved."""

    def __init__(self, message: str, *, retryable: bool, code: str | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.code = code


class LayoutMismatch(TransferError):
    """The two ends disagree on the KV layout; never retryable, never converted silently."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False, code="FAILED_PRECONDITION")

    @classmethod
    def between(cls, sender: KvLayout, receiver: KvLayout) -> LayoutMismatch:
        return cls(mismatch_message(sender, receiver))


def mismatch_message(sender: KvLayout, receiver: KvLayout) -> str:
    """The message of a layout mismatch, naming both layouts and their hashes."""
    return (
        f"KV layout mismatch: sender [{sender.describe()}] (hash {sender.compat_hash()}) "
        f"vs receiver [{receiver.describe()}] (hash {receiver.compat_hash()})"
    )


@dataclass(frozen=True)
class KvTargetSpec:
    """Where a request's KV goes: the blocks a decode worker reserved (worker.proto KvTarget)."""

    request_id: str
    block_ids: tuple[int, ...]
    address: str
    layout_hash: str
    backend: str


@dataclass(frozen=True)
class TransferStats:
    """What one finished transfer moved: payload bytes, wall seconds from start to ack, and
    chunk messages (including the final one)."""

    bytes: int
    seconds: float
    chunks: int


def layout_to_proto(layout: KvLayout) -> kv_pb2.KvLayout:
    """KvLayout -> wire message, with its compatibility hash filled in."""
    return kv_pb2.KvLayout(
        model=layout.model,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        block_size=layout.block_size,
        dtype=layout.dtype,
        tp_rank=layout.tp_rank,
        tp_size=layout.tp_size,
        order=layout.order,
        hash=layout.compat_hash(),
    )


def layout_from_proto(msg: kv_pb2.KvLayout) -> KvLayout:
    """Wire message -> KvLayout (the hash field is recomputed, not trusted)."""
    return KvLayout(
        model=msg.model,
        num_layers=msg.num_layers,
        num_kv_heads=msg.num_kv_heads,
        head_dim=msg.head_dim,
        block_size=msg.block_size,
        dtype=msg.dtype,
        tp_rank=msg.tp_rank,
        tp_size=msg.tp_size,
        order=msg.order,
    )


class SendHandle(ABC):
    """One request's outgoing transfer. Methods may be called from different threads."""

    @property
    @abstractmethod
    def state(self) -> TransferState:
        """The current TransferState."""

    @abstractmethod
    def push(self, layer: int, src_block_ids: Sequence[int], dst_block_offset: int) -> None:
        """Send layer `layer` of source blocks `src_block_ids` into target blocks
        [dst_block_offset, dst_block_offset + len(src_block_ids)) of the target's block list.

        Called on the engine thread right after that layer of those blocks is written. The data
        is copied out before this returns (the caller may overwrite the blocks right away); the
        sending itself happens asynchronously, so layer l moves while layer l+1 computes.
        After a failure or abort this is a cheap no-op; finish() reports the error.
        Raises ValueError (a caller bug) for a layer or block range outside the source pool
        or the target's block list.
        """

    @abstractmethod
    def push_all_layers(self, src_block_ids: Sequence[int], dst_block_offset: int) -> None:
        """push() of every layer of blocks whose KV is already complete in the pool (the
        prefill worker's own prefix cache). A backend may move all layers at once (cuda_ipc:
        one kernel); the same rules as push() apply."""

    @abstractmethod
    def seal(self, timeout: float) -> TransferStats:
        """Mark the transfer complete and return once every pushed byte is written and visible
        to the receiver and the final message is on its way: what the prefill worker waits for
        before it answers with the first token. Backends whose receiver writes the bytes (tcp,
        nccl, loopback) know this only from the receiver's ack, so this is finish(); a direct
        writer (cuda_ipc) knows it when its copies have landed, one round trip sooner. The
        stats count what was sent. Raises like finish(); at most once, and not after finish().
        """

    @abstractmethod
    def finish(self, timeout: float) -> TransferStats:
        """seal() if not yet done, then block until the receiver acknowledged that every
        pushed byte is written and visible. Raises TransferError on failure, on abort, or when
        `timeout` seconds pass (then the transfer is cancelled, retryable=True)."""

    @abstractmethod
    def abort(self) -> None:
        """Cancel the transfer; idempotent, never raises, no-op once final."""


class KvSender(ABC):
    """Prefill side: opens transfers into KvTargets. Reusable across requests."""

    @abstractmethod
    def start(self, target: KvTargetSpec, kv_pool: torch.Tensor) -> SendHandle:
        """Begin a transfer from `kv_pool` (this worker's pool, [L, 2, N, B, H, D]) into
        `target`. Raises LayoutMismatch if the layouts differ, TransferError if the receiver
        cannot be reached."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; transfers still in flight fail."""


class KvReceiver(ABC):
    """Decode side: accepts KV for reserved blocks and nothing else. Thread-safe."""

    @abstractmethod
    def expect(self, request_id: str, block_ids: Sequence[int]) -> None:
        """Accept chunks for `request_id` into `block_ids` (already reserved for it).
        Raises ValueError on a duplicate request id or an out-of-range block id."""

    @abstractmethod
    def forget(self, request_id: str, on_released: Callable[[], None] | None = None) -> bool:
        """Drop the request (abort, lease expiry, or decode took the blocks over): later chunks
        are refused, never written. May wait for one chunk's write (milliseconds) to finish.

        Returns True when no write for it can land any more, so its blocks may be reused at
        once: always for receivers that write the pool themselves (tcp, nccl, loopback), and
        for unknown ids. Returns False while a peer that writes the pool directly (cuda_ipc)
        is still attached: the peer is told to stop, and `on_released` is called exactly once,
        later and from another thread, when its last write has landed (it confirmed after
        synchronising its copies) or when it is gone (its connection broke, plus a grace
        period). Until then the caller must not reuse the blocks. A caller that keeps the
        blocks (the transfer completed; decode took them over) passes no callback.
        """

    @abstractmethod
    def received_bytes(self, request_id: str) -> int:
        """Payload bytes written so far for an expected request; KeyError if unknown."""

    @abstractmethod
    def is_complete(self, request_id: str) -> bool:
        """True once the final chunk was received and everything is written; KeyError if
        unknown."""
