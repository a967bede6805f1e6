"""Block manager properties (hypothesis): random allocate / free / share (fork) / register /
lookup / evict-by-allocation against a reference model kept here; every run drains to all-free."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pdserve.core.block_manager import BlockManager, NoFreeBlocks, prefix_hashes

NUM_BLOCKS = 12
HASHES = st.integers(min_value=0, max_value=15)


class BlockManagerMachine(RuleBasedStateMachine):
    """Holders own lists of block references; the model's ref counts are their multiset."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, block_size=4)
        self.holders: list[list[int]] = []
        self.tags: dict[int, set[int]] = {b: set() for b in range(NUM_BLOCKS)}  # hashes since last alloc

    def model_refs(self) -> list[int]:
        refs = [0] * NUM_BLOCKS
        for h in self.holders:
            for b in h:
                refs[b] += 1
        return refs

    @rule(n=st.integers(min_value=0, max_value=NUM_BLOCKS + 2))
    def allocate(self, n: int) -> None:
        free_before = self.model_refs().count(0)
        if n > free_before:
            with pytest.raises(NoFreeBlocks):
                self.bm.allocate(n)
            return
        got = self.bm.allocate(n)
        assert len(set(got)) == n
        refs = self.model_refs()
        assert all(refs[b] == 0 for b in got), "allocated a block still in use"
        for b in got:
            self.tags[b] = set()  # evicted or fresh: whatever it held is gone
        self.holders.append(got)

    @precondition(lambda self: self.holders)
    @rule(i=st.integers(min_value=0))
    def free(self, i: int) -> None:
        self.bm.free(self.holders.pop(i % len(self.holders)))

    @precondition(lambda self: self.holders)
    @rule(i=st.integers(min_value=0))
    def fork(self, i: int) -> None:
        blocks = self.holders[i % len(self.holders)]
        self.bm.share(blocks)
        self.holders.append(list(blocks))

    @precondition(lambda self: self.holders)
    @rule(i=st.integers(min_value=0), h=HASHES)
    def register(self, i: int, h: int) -> None:
        blocks = self.holders[i % len(self.holders)]
        if blocks:
            b = blocks[h % len(blocks)]
            self.bm.register(b, h)
            self.tags[b].add(h)

    @rule(chain=st.lists(HASHES, max_size=4))
    def lookup(self, chain: list[int]) -> None:
        hit = self.bm.lookup(chain)
        assert len(hit) <= len(chain)
        for b, h in zip(hit, chain):
            assert h in self.tags[b], f"block {b} returned for hash {h} it never held"
        self.holders.append(hit)

    @rule()
    def double_free_is_refused_without_side_effects(self) -> None:
        refs = self.model_refs()
        unused = [b for b in range(NUM_BLOCKS) if refs[b] == 0]
        used = [b for b in range(NUM_BLOCKS) if refs[b] > 0]
        if unused:
            with pytest.raises(RuntimeError):
                self.bm.free(used[:1] + unused[:1])
            with pytest.raises(RuntimeError):
                self.bm.share(used[:1] + unused[:1])

    @invariant()
    def counts_match_the_model(self) -> None:
        refs = self.model_refs()
        assert [self.bm.ref_count(b) for b in range(NUM_BLOCKS)] == refs
        assert self.bm.num_free == refs.count(0)

    def teardown(self) -> None:
        while self.holders:
            self.bm.free(self.holders.pop())
        assert self.bm.num_free == NUM_BLOCKS
        assert all(self.bm.ref_count(b) == 0 for b in range(NUM_BLOCKS))
        everything = self.bm.allocate(NUM_BLOCKS)  # cached blocks are evictable, not lost
        assert sorted(everything) == list(range(NUM_BLOCKS))
        self.bm.free(everything)
        assert self.bm.num_free == NUM_BLOCKS


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_eviction_is_least_recently_freed_first():
    bm = BlockManager(3, block_size=2)
    a, b, c = bm.allocate(3)
    for blk, h in ((a, 10), (b, 11), (c, 12)):
        bm.register(blk, h)
    bm.free([b])
    bm.free([a])
    bm.free([c])
    assert bm.allocate(1) == [b]  # freed first, evicted first
    assert bm.lookup([11]) == []
    assert bm.lookup([10]) == [a] and bm.ref_count(a) == 1  # a hit leaves the evictable list
    assert bm.allocate(1) == [c]
    bm.free([a, b, c])
    assert bm.num_free == 3


@given(st.lists(st.integers(0, 50), max_size=40), st.integers(1, 8))
def test_prefix_hashes_chain_covers_whole_prefix(tokens: list[int], bs: int):
    hs = prefix_hashes(tokens, bs)
    assert len(hs) == len(tokens) // bs
    other = [tokens[0] + 1, *tokens[1:]] if tokens else []
    assert all(x != y for x, y in zip(hs, prefix_hashes(other, bs)))  # a change early changes all
    assert prefix_hashes(tokens + [7] * bs, bs)[: len(hs)] == hs
