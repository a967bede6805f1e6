"""Triton varlen paged prefill attention (causal, cached prefix) against the reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_helpers import DEVICE, DTYPES, assert_close, make_block_tables, make_pool  # noqa: E402

from pdserve.kernels import reference  # noqa: E402
from pdserve.kernels.prefill_attention import paged_prefill_attention, prefill_with_tiles  # noqa: E402

BLOCK = 16
# (seq_len, new tokens): full prompts of 1, 15, 16 tokens; 17 new after a cached 16-token
# block; 37 new after a 63-token cached prefix (chunked prefill / prefix cache); an empty run.
RUNS = [(1, 1), (15, 15), (16, 16), (33, 17), (100, 37), (20, 0)]


def _case(dtype: torch.dtype, group: int, head_dim: int, kv_heads: int = 2):
    """Queries (strided view), layer-1 cache views, tables, seq lens, query_start_loc."""
    lens = [n for n, _ in RUNS]
    pool = make_pool(2, 24, BLOCK, kv_heads, head_dim, dtype)
    tables = make_block_tables(lens, BLOCK, 24, width=8)
    new = torch.tensor([0] + [m for _, m in RUNS])
    qsl = new.cumsum(0).to(torch.int32).to(DEVICE)
    t = int(new.sum())
    wide = torch.randn(t, kv_heads * group + 2, head_dim, dtype=dtype, device=DEVICE)
    q = wide[:, 2:]
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return q, pool[1, 0], pool[1, 1], tables, seq_lens, qsl


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("group", "head_dim"), [(1, 64), (4, 128), (3, 64)])
def test_prefill_matches_reference(dtype: torch.dtype, group: int, head_dim: int) -> None:
    q, kc, vc, tables, lens, qsl = _case(dtype, group, head_dim)
    scale = head_dim**-0.5
    out = paged_prefill_attention(q, kc, vc, tables, lens, qsl, scale)
    assert_close(out, reference.paged_prefill_attention(q, kc, vc, tables, lens, qsl, scale))


@pytest.mark.parametrize(("block_m", "block_n"), [(16, 64), (64, 32)])
def test_prefill_tile_shapes(block_m: int, block_n: int) -> None:
    """Query tiles of 4 and 16 tokens (G=4) against KV tiles spanning 4 and 2 cache blocks."""
    q, kc, vc, tables, lens, qsl = _case(torch.float32, 4, 64)
    out = prefill_with_tiles(q, kc, vc, tables, lens, qsl, 0.1, block_m, block_n)
    assert_close(out, reference.paged_prefill_attention(q, kc, vc, tables, lens, qsl, 0.1))


def test_prefill_rejects_short_query_start_loc() -> None:
    q, kc, vc, tables, lens, qsl = _case(torch.float32, 1, 64)
    with pytest.raises(AssertionError, match="need B\\+1"):
        paged_prefill_attention(q, kc, vc, tables, lens, qsl[:-1], 0.1)
