"""Token logprobs: the sampler's queued log-softmax, the runner against transformers, verify steps."""

from __future__ import annotations

import pytest
import torch
from model.hf_tiny import hf_model, tiny_model  # noqa: F401 (fixture)

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import SeqSlice, StepInput, TokenLogprobs
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.sampler import queue_logprobs
from pdserve.runtime.spec_verify import verify_step


def _expected(logits: torch.Tensor, token: int, k: int) -> TokenLogprobs:
    lp = logits.double().log_softmax(-1)
    top = lp.topk(k) if k else None
    pairs = () if top is None else tuple(zip(top.indices.tolist(), top.values.tolist()))
    return TokenLogprobs(lp[token].item(), pairs)


def _close(got: TokenLogprobs, want: TokenLogprobs, tol: float = 1e-5) -> None:
    assert got.logprob == pytest.approx(want.logprob, abs=tol)
    assert [t for t, _ in got.top] == [t for t, _ in want.top]
    assert [v for _, v in got.top] == pytest.approx([v for _, v in want.top], abs=tol)


@pytest.mark.parametrize("asks", [(None, 0, 3, None, 20), (2, 2), (None, None)])
def test_queue_logprobs_is_the_log_softmax_of_the_asking_rows(asks) -> None:
    g = torch.Generator().manual_seed(len(asks))
    logits = torch.randn(len(asks), 50, generator=g) * 3
    tokens = torch.randint(0, 50, (len(asks),), generator=g)
    params = [SamplingParams(logprobs=k) for k in asks]
    queued = queue_logprobs(logits, tokens, params)
    rows = [r for r, k in enumerate(asks) if k is not None]
    if not rows:
        assert queued is None
        return
    assert queued.rows == rows
    entries = queued.to_host().entries()
    for r, got in zip(rows, entries):
        assert len(got.top) == asks[r]
        _close(got, _expected(logits[r], int(tokens[r]), asks[r]))
        assert all(a[1] >= b[1] for a, b in zip(got.top, got.top[1:]))


def test_more_alternatives_than_the_vocabulary_lists_them_all() -> None:
    logits = torch.randn(2, 6)
    entries = queue_logprobs(logits, torch.tensor([1, 2]), [SamplingParams(logprobs=20)] * 2).entries()
    assert [len(e.top) for e in entries] == [6, 6]


def test_runner_logprobs_equal_transformers(tiny_model) -> None:  # noqa: F811 (fixture)
    """Prefill then decode steps with three requests side by side: greedy with 5 alternatives,
    seeded sampling with suppressed ids and the token's logprob only, one asking none. Each
    reported logprob is transformers' log-softmax at that position (raw logits: temperature and
    suppression change what is drawn, not what is reported)."""
    path = tiny_model("llama")
    hf = hf_model(path)
    runner = ModelRunner(ModelSpec.from_dir(path), path, num_blocks=32, block_size=4)
    asks = {
        "greedy": SamplingParams(temperature=0.0, logprobs=5),
        "drawn": SamplingParams(temperature=1.3, top_p=0.9, seed=3, logprobs=0),
        "none": SamplingParams(temperature=0.0),
    }
    suppress = {"drawn": (7, 8, 9)}
    prompts = {"greedy": [3, 14, 15, 92, 65], "drawn": [35, 89, 79, 32, 38, 46, 26], "none": [43, 38, 32]}
    tables = {rid: tuple(range(8 * i, 8 * i + 8)) for i, rid in enumerate(asks)}
    seqs = {rid: list(p) for rid, p in prompts.items()}
    start = {rid: 0 for rid in asks}
    for _ in range(4):
        step = StepInput(tuple(
            SeqSlice(rid, tuple(seqs[rid][start[rid]:]), start[rid], tables[rid], asks[rid],
                     suppress_token_ids=suppress.get(rid, ()))
            for rid in asks))
        out = runner.execute(step)
        assert set(out.logprobs) == {"greedy", "drawn"}
        for rid in ("greedy", "drawn"):
            token = out.sampled[rid]
            with torch.no_grad():
                want_logits = hf(torch.tensor([seqs[rid]])).logits[0, -1]
            _close(out.logprobs[rid], _expected(want_logits, token, asks[rid].logprobs), tol=1e-4)
        assert out.logprobs["greedy"].top[0][0] == out.sampled["greedy"]
        assert out.sampled["drawn"] not in suppress["drawn"]
        for rid in asks:
            start[rid] = len(seqs[rid])
            seqs[rid].append(out.sampled[rid])


def test_verify_step_reports_logprobs_of_rows_without_drafts() -> None:
    """A speculative step mixes a greedy slice with 2 drafts (rows 0-2) and a slice without
    drafts asking for logprobs (row 3): only the latter gets them, from its own row."""
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(5)) * 4
    drafted = SeqSlice("d", (5, 6, 7), 9, (0, 1, 2, 3), SamplingParams(temperature=0.0), num_drafts=2)
    plain = SeqSlice("p", (11,), 4, (4, 5), SamplingParams(temperature=0.0, logprobs=2))
    out = verify_step(logits, [(drafted, 0), (plain, 3)], None)
    assert set(out.logprobs) == {"p"} and set(out.emitted) == {"d"}
    token = out.sampled["p"]
    assert token == int(logits[3].argmax())
    _close(out.logprobs["p"], _expected(logits[3], token, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_decode_logprobs_equal_eager(tiny_model) -> None:  # noqa: F811 (fixture)
    """The same bf16 decode steps through CUDA graphs (overlapped launches) and eagerly report
    the same tokens and logprobs (the graph's logits buffer is read before the next replay)."""
    path = tiny_model("llama")
    spec = ModelSpec.from_dir(path)
    p = SamplingParams(temperature=0.0, logprobs=4)
    results = []
    for eager in (False, True):
        r = ModelRunner(spec, path, device="cuda", dtype=torch.bfloat16, num_blocks=64, block_size=16,
                        max_num_seqs=8, enforce_eager=eager)
        seqs = {f"r{i}": [3 + i, 14, 15, 92, 65 + i] for i in range(3)}
        got = []
        for n in range(5):
            step = StepInput(tuple(
                SeqSlice(rid, tuple(s[-1:]) if n else tuple(s), len(s) - 1 if n else 0, (4 * i, 4 * i + 1), p)
                for i, (rid, s) in enumerate(seqs.items())))
            assert r.graphed(step) == (n > 0 and not eager)
            out = r.launch(step).result()
            for rid in seqs:
                seqs[rid].append(out.sampled[rid])
            got.append(out.logprobs)
        results.append(got)
    for graphed, eager in zip(*results):
        for rid in graphed:
            _close(graphed[rid], eager[rid], tol=2e-2)
