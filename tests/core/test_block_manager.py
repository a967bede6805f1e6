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


def test_prefix_hashes_are_the_same_in_every_process():
    # Two workers must name a block alike: no per-process randomization (PYTHONHASHSEED).
    import subprocess
    import sys

    code = ("from pdserve.core.block_manager import prefix_hashes;"
            "print(prefix_hashes(list(range(40)), 16, salt=7))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout.strip()
            for seed in ("1", "2")}
    assert runs == {str(prefix_hashes(list(range(40)), 16, salt=7))}


def test_salt_separates_chains_and_is_checked():
    tokens = list(range(32))
    assert BlockManager(4, 16, salt=1).hashes(tokens) == prefix_hashes(tokens, 16, salt=1)
    assert set(prefix_hashes(tokens, 16, salt=1)).isdisjoint(prefix_hashes(tokens, 16, salt=2))
    with pytest.raises(ValueError, match="salt"):
        BlockManager(4, 16, salt=-1)


def _cache_prompt(bm: BlockManager, prompt: list[int]) -> list[int]:
    """Fill and register a prompt's full blocks as a finished sequence would, then free them."""
    hashes = bm.hashes(prompt)
    table = bm.allocate(bm.blocks_for(len(prompt)))
    for b, h in zip(table, hashes):
        bm.register(b, h)
    bm.free(table)
    return table


def test_allocate_prompt_pins_the_cached_prefix_but_never_the_last_tokens_block():
    bm = BlockManager(16, block_size=4, salt=3)
    prompt = list(range(100, 112))  # 3 full blocks
    cached = _cache_prompt(bm, prompt)
    assert bm.num_free == 16  # cached blocks count as free
    table, hit = bm.allocate_prompt(12, bm.hashes(prompt))
    assert hit == 2 and table[:2] == cached[:2]  # block 3 holds the last token: computed anew
    assert len(table) == 3 and table[2] != cached[2]
    assert [bm.ref_count(b) for b in table] == [1, 1, 1]
    longer = prompt + [5, 6]
    table2, hit2 = bm.allocate_prompt(len(longer), bm.hashes(longer))
    assert hit2 == 3 and table2[:2] == cached[:2] and bm.ref_count(cached[0]) == 2
    other = [0] + prompt[1:]
    table3, hit3 = bm.allocate_prompt(12, bm.hashes(other))
    table4, hit4 = bm.allocate_prompt(12, [])
    assert hit3 == hit4 == 0  # a different first token, no hashes: no hit
    assert bm.num_free == 16 - 5 - 6
    for t in (table, table2, table3, table4):
        bm.free(t)
    assert bm.num_free == 16 and bm.lookup(bm.hashes(prompt)) == cached


def test_allocate_prompt_is_all_or_nothing():
    bm = BlockManager(4, block_size=4)
    prompt = list(range(13))  # 4 blocks, 3 cacheable
    cached = _cache_prompt(bm, prompt[:12])
    hog = bm.allocate(1)  # the one block that was not cached
    assert set(hog).isdisjoint(cached)
    big = prompt[:8] + list(range(50, 70))  # 2 cached blocks, then 5 more needed, 2 available
    with pytest.raises(NoFreeBlocks):
        bm.allocate_prompt(len(big), bm.hashes(big))
    assert bm.num_free == 3 and all(bm.ref_count(b) == 0 for b in cached)
    assert bm.lookup(bm.hashes(prompt)[:3]) == cached[:3]  # still cached


def test_a_chain_is_evicted_from_its_deepest_block():
    bm = BlockManager(6, block_size=2)
    prompt = list(range(8))
    cached = _cache_prompt(bm, prompt)  # 4 blocks cached, 2 never used
    assert bm.allocate(4)  # the 2 free, then the 2 deepest of the chain
    assert bm.lookup(bm.hashes(prompt)) == cached[:2]
