"""Token bitmasks as structured output passes them (SeqSlice.allowed: bit t % 8 of byte t // 8)."""

from __future__ import annotations


def bitmask(ids: list[int], nbytes: int) -> bytes:
    """The mask allowing exactly `ids`, nbytes long."""
    out = bytearray(nbytes)
    for t in ids:
        out[t // 8] |= 1 << (t % 8)
    return bytes(out)


def allowed_ids(mask: bytes, limit: int | None = None) -> list[int]:
    """The ids a mask allows, below `limit` if given (llguidance's masks carry padding bytes)."""
    n = len(mask) * 8 if limit is None else min(len(mask) * 8, limit)
    return [t for t in range(n) if mask[t // 8] >> (t % 8) & 1]
