"""Paged KV block accounting: free list, reference counts, prefix-hash cache (pure Python)."""

from __future__ import annotations

from collections import OrderedDict


class NoFreeBlocks(RuntimeError):
    """Raised when an allocation asks for more blocks than are free."""


class BlockManager:
    """Owns the ids of one worker's KV pool.

    A block is *used* (ref count > 0), *cached* (ref count 0, but its content is known by a
    prefix hash and may be reused until evicted, least recently freed first) or *free*.
    Cached blocks count as free: `num_free` is what an allocation can get.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_total = num_blocks
        self.block_size = block_size
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

        All or nothing: a double free raises before any count changes.
        """
        drops: dict[int, int] = {}
        for b in blocks:
            drops[b] = drops.get(b, 0) + 1
        for b, n in drops.items():
            if self._refs[b] < n:
                raise RuntimeError(f"double free of block {b}")
        for b in blocks:
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

    def reset_prefix_cache(self) -> None:
        for b in list(self._evictable):
            self._free.append(b)
        self._evictable.clear()
        for b in [b for b in self._hash_of if self._refs[b] == 0]:
            del self._block_of[self._hash_of.pop(b)]


def prefix_hashes(token_ids: list[int], block_size: int, salt: int = 0) -> list[int]:
    """Hash chain over the full blocks of token_ids: each hash covers the whole prefix."""
    out, h = [], salt
    for i in range(len(token_ids) // block_size):
        h = hash((h, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        out.append(h)
    return out
