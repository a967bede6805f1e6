"""Workload generators: length bounds, vocabulary, shared prefix, the shipped ShareGPT-like mix."""

from __future__ import annotations

import json

import pytest

from pdserve.bench import datasets


def test_random_lengths_within_range_ratio() -> None:
    reqs = datasets.random_requests(500, input_len=100, output_len=40, range_ratio=0.5, vocab_size=1000, seed=1)
    assert all(50 <= r.prompt_len <= 150 and 20 <= r.output_len <= 60 for r in reqs)
    assert len({r.prompt_len for r in reqs}) > 20  # really varied
    assert all(0 <= t < 1000 for r in reqs for t in r.prompt_ids)


def test_random_zero_ratio_is_exact_and_seeded() -> None:
    a = datasets.random_requests(20, 64, 8, 0.0, 32000, seed=5)
    assert all(r.prompt_len == 64 and r.output_len == 8 for r in a)
    assert a == datasets.random_requests(20, 64, 8, 0.0, 32000, seed=5)
    assert a != datasets.random_requests(20, 64, 8, 0.0, 32000, seed=6)


def test_range_ratio_must_be_below_one() -> None:
    with pytest.raises(ValueError):
        datasets.length_bounds(10, 1.0)


def test_shared_prefix_is_shared_and_suffixes_distinct() -> None:
    reqs = datasets.shared_prefix_requests(30, prefix_len=64, input_len=16, output_len=4, range_ratio=0.0,
                                           vocab_size=32000, seed=0)
    prefixes = {r.prompt_ids[:64] for r in reqs}
    assert len(prefixes) == 1
    assert len({r.prompt_ids[64:] for r in reqs}) == 30
    assert all(r.prompt_len == 80 for r in reqs)


def test_sharegpt_like_is_synthetic_and_fits_the_model() -> None:
    doc = json.loads(datasets.SHAREGPT_LIKE.read_text())
    assert "SYNTHETIC" in doc["description"] and len(doc["pairs"]) >= 500
    pairs = set(datasets.load_length_pairs())
    reqs = datasets.sharegpt_like_requests(200, vocab_size=32000, max_model_len=512, seed=0)
    assert all((r.prompt_len, r.output_len) in pairs and r.prompt_len + r.output_len <= 512 for r in reqs)


def test_build_by_name() -> None:
    kw = dict(input_len=8, output_len=2, range_ratio=0.0, prefix_len=4, vocab_size=100, max_model_len=None, seed=0)
    for name in datasets.DATASETS:
        assert len(datasets.build(name, 3, **kw)) == 3
    with pytest.raises(ValueError):
        datasets.build("nope", 3, **kw)
