"""Paged KV block accounting: free list, reference counts, prefix-hash cache (pure Python)."""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence


class NoFreeBlocks(RuntimeError):
    """Raised when an allocation asks for more blocks than are free."""


class BlockManager:
    """Owns the ids of one worker's KV pool.

    A block is *used* (ref count > 0), *cached* (ref count 0, but its content is known by a
    prefix hash and may be reused until evicted, least recently freed first) or *free*.
    Cached blocks count as free: `num_free` is what an allocation can get, and a drained
    worker (the leak check) has num_free == num_total whatever its cache holds.

    `salt` starts every hash chain (`hashes`): workers whose KV is interchangeable (same
    KvLayout) use the same salt, so a block's hash names the same content on each of them.
    """

    def __init__(self, num_blocks: int, block_size: int, salt: int = 0) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        if not 0 <= salt < 1 << 128:
            raise ValueError(f"salt: must be in [0, 2**128), got {salt}")
        self.num_total = num_blocks
        self.block_size = block_size
        self.salt = salt
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}
        self._block_of: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks with ref count 1 (evicting cached ones, oldest first, if needed)."""
        if n > self.num_free:
            raise NoFreeBlocks(f"need {n} blocks, {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:
                b, _ = self._evictable.popitem(last=False)
                del self._block_of[self._hash_of.pop(b)]
            self._refs[b] = 1
            out.append(b)
        return out

    def free(self, blocks: list[int]) -> None:
        """Drop one reference from each block; unreferenced blocks become free or cached.

        All or nothing: a double free raises before any count changes. Within one call, cached
        blocks become evictable last block first: a hash chain is only useful from its head, so
        its deepest blocks should go first.
        """
        drops: dict[int, int] = {}
        for b in blocks:
            drops[b] = drops.get(b, 0) + 1
        for b, n in drops.items():
            if self._refs[b] < n:
                raise RuntimeError(f"double free of block {b}")
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                if b in self._hash_of:
                    self._evictable[b] = None
                else:
                    self._free.append(b)

    def share(self, blocks: list[int]) -> None:
        """Add a reference to blocks already in use (fork); all or nothing."""
        if any(self._refs[b] <= 0 for b in blocks):
            raise RuntimeError(f"cannot share unused blocks {[b for b in blocks if self._refs[b] <= 0]}")
        for b in blocks:
            self._refs[b] += 1

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    # -- prefix cache --------------------------------------------------------------------------

    def register(self, block: int, prefix_hash: int) -> None:
        """Mark a full, computed block as holding the content named by prefix_hash."""
        if self._refs[block] <= 0:
            raise RuntimeError(f"cannot register unused block {block}")
        if prefix_hash in self._block_of or block in self._hash_of:
            return
        self._hash_of[block] = prefix_hash
        self._block_of[prefix_hash] = block

    def lookup(self, prefix_hashes: list[int]) -> list[int]:
        """Take a reference on the longest run of cached blocks matching the hash chain."""
        hit = []
        for h in prefix_hashes:
            b = self._block_of.get(h)
            if b is None:
                break
            hit.append(b)
        for b in hit:
            if self._refs[b] == 0:
                del self._evictable[b]
            self._refs[b] += 1
        return hit

    def hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The prefix hash chain of token_ids' full blocks, salted with this manager's salt."""
        return prefix_hashes(token_ids, self.block_size, self.salt)

    def allocate_prompt(self, num_tokens: int, hashes: Sequence[int]) -> tuple[list[int], int]:
        """A block table for a prompt of num_tokens whose KV is filled in elsewhere (a transfer):
        the longest cached prefix of `hashes` (pinned), then fresh blocks for the rest.

        Returns (table, number of cached blocks at its head). The block of the last token is
        never taken from the cache (see `cacheable_blocks`). All or nothing: NoFreeBlocks
        leaves every count as it was.
        """
        hit = self.lookup(list(hashes[: cacheable_blocks(num_tokens, self.block_size)]))
        try:
            fresh = self.allocate(self.blocks_for(num_tokens) - len(hit))
        except NoFreeBlocks:
            self.free(hit)
            raise
        return hit + fresh, len(hit)

    def reset_prefix_cache(self) -> None:
        for b in list(self._evictable):
            self._free.append(b)
        self._evictable.clear()
        for b in [b for b in self._hash_of if self._refs[b] == 0]:
            del self._block_of[self._hash_of.pop(b)]


def cacheable_blocks(num_tokens: int, block_size: int) -> int:
    """How many leading blocks of a num_tokens prompt may come from a prefix cache.

    All full blocks but one holding the last token: the next token is sampled from the last
    token's logits, so whoever samples it must compute that token, and its block, anew.
    """
    return max(0, (num_tokens - 1) // block_size)


def prefix_hashes(token_ids: Sequence[int], block_size: int, salt: int = 0) -> list[int]:
    """Hash chain over the full blocks of token_ids: each hash covers the whole prefix.

    blake2b (128 bits) over the parent digest and the block's tokens as little-endian uint32:
    the same on every process, host and Python build (unlike hash()), and not open to
    crafted collisions that would hand one prompt another prompt's KV.
    """
    h = salt.to_bytes(16, "little")
    fmt = f"<{block_size}I"
    out = []
    for i in range(len(token_ids) // block_size):
        block = token_ids[i * block_size : (i + 1) * block_size]
        h = hashlib.blake2b(h + struct.pack(fmt, *block), digest_size=16).digest()
        out.append(int.from_bytes(h, "little"))
    return out
