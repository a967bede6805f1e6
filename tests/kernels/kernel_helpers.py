"""Helpers of the kernel tests: device, tolerances, random paged caches (never imports triton)."""

from __future__ import annotations

import pytest
import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """fp32: ~1e-4 relative; bf16/fp16: ~1e-2 (a couple of ulps of the rounded result)."""
    assert actual.shape == expected.shape, f"{tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{actual.dtype} != {expected.dtype}"
    if expected.dtype == torch.float32:
        rtol, atol = 1e-4, 1e-4
    else:
        rtol, atol = 1.6e-2, 1e-2
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), rtol=rtol, atol=atol)


def make_pool(
    layers: int, blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> torch.Tensor:
    """A random KV pool [L, 2, N, S, Hk, D]; per-layer caches are views pool[l, 0/1]."""
    return torch.randn(layers, 2, blocks, block_size, kv_heads, head_dim, dtype=dtype, device=DEVICE)


def make_block_tables(seq_lens: list[int], block_size: int, blocks: int, width: int) -> torch.Tensor:
    """Random, disjoint, shuffled block ids per sequence: int32 [B, width] (unused = 0)."""
    need = [(n + block_size - 1) // block_size for n in seq_lens]
    assert sum(need) <= blocks and max(need) <= width
    ids = torch.randperm(blocks)[: sum(need)].tolist()
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(ids[:n], dtype=torch.int32)
        ids = ids[n:]
    return table.to(DEVICE)


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the tokens expected 5+ times (the rest pooled), and its degrees
    of freedom."""
    n = tokens.numel()
    seen = torch.bincount(tokens.cpu(), minlength=probs.numel()).double()
    want = probs.cpu() * n
    big = want >= 5
    obs = torch.cat([seen[big], seen[~big].sum()[None]])
    exp = torch.cat([want[big], want[~big].sum()[None]])
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


# 99.9th percentile of chi-square with df degrees of freedom, df 1..40 (Wilson-Hilferty)
def chi2_999(df: int) -> float:
    z = 3.0902
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def grid(*factors: list) -> list:
    """pytest params over factors (lists of values or pytest.param, a param's values filling one
    or more arguments): their full product on a GPU; on CPU, where the Triton interpreter runs a
    case in seconds, a subset holding every pair of values of any two factors (greedy: each
    case taken is the one covering most pairs not yet covered)."""
    import itertools

    norm = [[p if hasattr(p, "values") else pytest.param(p, id=str(p)) for p in f] for f in factors]
    product = list(itertools.product(*(range(len(f)) for f in norm)))
    if DEVICE.type != "cpu" or len(norm) < 3:
        chosen = product
    else:
        def pairs(case: tuple[int, ...]) -> set:
            return {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(case)), 2)}

        left, chosen = set().union(*map(pairs, product)), []
        while left:
            best = max(product, key=lambda c: len(pairs(c) & left))  # first of the best: stable
            chosen.append(best)
            left -= pairs(best)
    return [pytest.param(*(v for f, i in zip(norm, c) for v in f[i].values), id="-".join(
        str(f[i].id) for f, i in zip(norm, c))) for c in chosen]
