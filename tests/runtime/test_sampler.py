"""Tensor sampler: greedy, top-k, top-p, suppression and per-position seeds."""

from __future__ import annotations

import pytest
import torch

from pdserve.core.sampling import SamplingParams
from pdserve.kernels import reference
from pdserve.runtime.sampler import TRITON_NUCLEUS_MIN_ROWS, argmax_rows, position_seed, sample_on_device, sample_tokens
from pdserve.runtime import sampler
from pdserve.runtime.sampler import token_probs

V = 50


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 2


def test_greedy_is_argmax() -> None:
    x = _logits(6)
    got = sample_tokens(x, [SamplingParams(temperature=0.0)] * 6, list(range(6)))
    assert got == x.argmax(-1).tolist()


def test_seeded_draw_ignores_batch_composition() -> None:
    row = _logits(1, seed=1)
    p = SamplingParams(temperature=1.0, seed=42)
    alone = [sample_tokens(row, [p], [pos])[0] for pos in range(40)]
    others = _logits(3, seed=2)
    mixed = []
    for pos in range(40):
        batch = torch.cat([others[:2], row, others[2:]])
        params = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.0), p,
                  SamplingParams(temperature=1.0, seed=7)]
        gen = torch.Generator().manual_seed(pos)  # the unseeded rows' stream varies too
        mixed.append(sample_tokens(batch, params, [pos + 3, 5, pos, pos], generator=gen)[2])
    assert alone == mixed
    assert len(set(alone)) > 5  # really sampling, not stuck on the argmax
    other_seed = [sample_tokens(row, [SamplingParams(temperature=1.0, seed=43)], [pos])[0] for pos in range(40)]
    assert other_seed != alone


def test_seeded_rows_leave_the_runners_generator_alone() -> None:
    """A batch of seeded rows draws nothing from the runner's generator (its unseeded requests'
    stream does not depend on seeded neighbours); an unseeded row does draw from it."""
    x = _logits(3, seed=4)
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    seeded = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2)] + [SamplingParams(temperature=0.5, top_k=9, seed=3)]
    sample_tokens(x, seeded, [0, 1, 2], generator=gen)
    assert torch.equal(gen.get_state(), state)
    sample_tokens(x, seeded[:2] + [SamplingParams(temperature=1.0)], [0, 1, 2], generator=gen)
    assert not torch.equal(gen.get_state(), state)


def test_position_seed_depends_on_both() -> None:
    seeds = {position_seed(s, p) for s in range(20) for p in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)


def test_top_k_one_equals_greedy() -> None:
    x = _logits(8, seed=3)
    got = sample_tokens(x, [SamplingParams(temperature=1.5, top_k=1)] * 8, [0] * 8)
    assert got == x.argmax(-1).tolist()
    # The filtering path itself keeps exactly the argmax with k = 1.
    probs = token_probs(x, [SamplingParams(temperature=1.5, top_k=1)] * 8)
    assert torch.equal(probs.argmax(-1), x.argmax(-1)) and torch.all((probs > 0).sum(-1) == 1)


def test_tiny_top_p_equals_greedy() -> None:
    x = _logits(8, seed=4)
    got = sample_tokens(x, [SamplingParams(temperature=1.0, top_p=1e-6)] * 8, list(range(8)),
                        generator=torch.Generator().manual_seed(0))
    assert got == x.argmax(-1).tolist()


def test_top_k_and_top_p_stay_inside_their_sets() -> None:
    x = _logits(1, seed=5).repeat(400, 1)
    g = torch.Generator().manual_seed(0)
    top5 = set(x[0].topk(5).indices.tolist())
    got = sample_tokens(x, [SamplingParams(temperature=2.0, top_k=5)] * 400, [0] * 400, generator=g)
    assert set(got) <= top5 and len(set(got)) > 1
    p = x[0].softmax(-1)
    order = p.argsort(descending=True).tolist()
    nucleus = set(order[: int((p[order].cumsum(0) < 0.8).sum()) + 1])
    got = sample_tokens(x, [SamplingParams(temperature=1.0, top_p=0.8)] * 400, [0] * 400, generator=g)
    assert set(got) <= nucleus and len(set(got)) > 1


def test_min_p_draws_stay_above_the_cut() -> None:
    """min_p keeps the tokens at least min_p times as likely as the best (after temperature),
    alone or with top-k; the probabilities it leaves sum to 1 (rejection sampling reads them)."""
    x = _logits(1, seed=6).repeat(400, 1)
    p = (x[0] / 1.5).softmax(-1)
    kept = set((p >= 0.2 * p.max()).nonzero().flatten().tolist())
    assert 1 < len(kept) < 20
    g = torch.Generator().manual_seed(0)
    got = sample_tokens(x, [SamplingParams(temperature=1.5, min_p=0.2)] * 400, [0] * 400, generator=g)
    assert set(got) <= kept and len(set(got)) > 1
    both = SamplingParams(temperature=1.5, min_p=0.2, top_k=2)
    got = sample_tokens(x, [both] * 400, [0] * 400, generator=g)
    assert set(got) <= kept & set(p.topk(2).indices.tolist())
    probs = token_probs(x[:2], [SamplingParams(temperature=1.5, min_p=0.2), SamplingParams(temperature=1.5)])
    assert torch.allclose(probs.sum(-1), torch.ones(2)) and (probs[0] > 0).sum() == len(kept)


def test_temperature_draws_follow_softmax() -> None:
    x = torch.tensor([[0.0, 1.0, 2.0, 0.5]]).repeat(8000, 1)
    got = torch.tensor(sample_tokens(x, [SamplingParams(temperature=1.0)] * 8000, [0] * 8000,
                                     generator=torch.Generator().manual_seed(1)))
    freq = torch.bincount(got, minlength=4).float() / 8000
    assert torch.allclose(freq, x[0].softmax(-1), atol=0.02)


def test_suppressed_ids_never_sampled() -> None:
    x = _logits(200, seed=6)
    top = x.argmax(-1)
    banned = [(int(t), 0, 1) for t in top]
    greedy = sample_tokens(x, [SamplingParams(temperature=0.0)] * 200, [0] * 200, banned)
    sampled = sample_tokens(x, [SamplingParams(temperature=5.0)] * 200, list(range(200)), banned,
                            generator=torch.Generator().manual_seed(2))
    for row, (g, s) in enumerate(zip(greedy, sampled)):
        assert g not in banned[row] and s not in banned[row]
    assert torch.equal(x.argmax(-1), top)  # the caller's logits are left untouched


def test_two_stage_argmax_equals_argmax_with_ties() -> None:
    """Real vocab sizes (split in chunks) and a prime one (one stage): the first index of the
    maximum, also with tied maxima, a constant row and a row of -inf."""
    gen = torch.Generator().manual_seed(0)
    for v in (128256, 152064, 49152, 131071):
        for trial in range(6):
            x = torch.randn(3, v, generator=gen)
            if trial == 1:
                x[:, 5::7] = x.max() + 1  # ties across chunks; the first is at 5
            if trial == 2:
                x[:] = 0.0
            if trial == 3:
                x[1] = float("-inf")
            assert torch.equal(argmax_rows(x), x.argmax(-1)), (v, trial)
    big = torch.randn(20, 128256, generator=gen)  # many rows: one stage
    assert torch.equal(argmax_rows(big), big.argmax(-1))
    x = torch.zeros(2, 128256)
    x[0, 128255], x[1, 1] = 1.0, 1.0  # the last index of the last chunk, and an early one
    assert argmax_rows(x).tolist() == [128255, 1]


def test_mixed_batch_keeps_greedy_rows_and_masks_suppressed_ids() -> None:
    """Greedy rows beside drawn ones stay argmax; suppressed ids are never picked; a batch of
    only drawn rows (no gather/scatter) gives each row a token its filters allow."""
    x = _logits(5, seed=3)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=3),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.5, seed=7),
              SamplingParams(temperature=0.0)]
    top1 = x.argmax(-1).tolist()
    suppress = [(), (), (top1[2],), (), ()]
    for _ in range(20):
        got = sample_tokens(x, params, list(range(5)), suppress)
        assert got[0] == top1[0] and got[4] == top1[4]
        assert got[2] == x[2].clone().index_fill_(0, torch.tensor([top1[2]]), float("-inf")).argmax().item()
        assert got[1] in x[1].topk(3).indices.tolist()
    drawn = sample_tokens(x, [SamplingParams(temperature=1.0, top_k=2)] * 5, list(range(5)))
    assert all(t in x[b].topk(2).indices.tolist() for b, t in enumerate(drawn))


def test_kernel_draws_rows_without_top_k_on_cuda_only() -> None:
    """Which rows a Triton kernel draws, and which: a row's own settings and the device decide,
    never the batch (the seeded-composition guarantee rests on it)."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    draw = sampler._kernel_draw
    assert draw(SamplingParams(temperature=1.0, top_p=0.9), 1000, cuda) is sampler._top_p_draw
    assert draw(SamplingParams(temperature=0.5, top_p=0.9, top_k=1000), 1000, cuda) is sampler._top_p_draw  # k >= V
    assert draw(SamplingParams(temperature=1.0), 1000, cuda) is sampler._temperature_draw
    assert draw(SamplingParams(temperature=0.7, seed=3, top_k=-1), 1000, cuda) is sampler._temperature_draw
    assert draw(SamplingParams(temperature=1.0, top_p=0.9, top_k=50), 1000, cuda) is None
    assert draw(SamplingParams(temperature=1.0, top_k=50), 1000, cuda) is None
    assert draw(SamplingParams(temperature=1.0, top_p=0.9), 1000, cpu) is None
    assert draw(SamplingParams(temperature=1.0), 1000, cpu) is None


def _gpu_sync_errors(fn):
    """Run fn with CUDA's synchronizing calls turned into errors; return its result."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.gpu
def test_sampling_queues_without_a_host_sync() -> None:
    """Temperature, top-k/top-p, seeds and suppressed ids sample with no host synchronisation
    (a pageable host-to-device copy waits for the stream: an overlapped loop would stall)."""
    x = torch.randn(6, 1000, device="cuda") * 3
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.7, top_k=50), SamplingParams(temperature=1.0, top_p=0.9),
              SamplingParams(temperature=1.0, seed=5), SamplingParams(temperature=0.0)]
    suppress = [(), (3, 5), (), (), (7,), (int(x[5].argmax()),)]
    for _ in range(2):  # the second round runs on warm pinned-memory and generator caches
        mixed = _gpu_sync_errors(lambda: sample_on_device(x, params, list(range(6)), suppress))
        drawn = _gpu_sync_errors(lambda: sample_on_device(x, [SamplingParams(temperature=1.0)] * 6, list(range(6))))
        many = x.repeat(11, 1)  # past TRITON_NUCLEUS_MIN_ROWS: the Triton top-k/top-p threshold
        nucleus = _gpu_sync_errors(lambda: sample_on_device(many, [params[2], params[3]] * 33, list(range(66))))
    assert len(many) >= TRITON_NUCLEUS_MIN_ROWS and len(nucleus.tolist()) == 66
    mixed, ref = mixed.tolist(), x.argmax(-1).tolist()
    assert mixed[0] == ref[0] and mixed[5] != ref[5] and mixed[1] not in (3, 5) and mixed[4] != 7
    assert len(drawn.tolist()) == 6


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 80])
def test_cuda_token_probs_match_the_cpu_path(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """token_probs on CUDA with the Triton nucleus_threshold (no sort; forced at 16 rows, the
    default at 80) against the CPU path (sorted) at Llama-3's vocab size: the same kept tokens
    and probabilities, but for fp32 sums in another order, which may move a row's top-p cut by
    its one boundary token."""
    monkeypatch.setattr(sampler, "TRITON_NUCLEUS_MIN_ROWS", min(rows, TRITON_NUCLEUS_MIN_ROWS))
    x = torch.randn(rows, 128256, generator=torch.Generator().manual_seed(3)) * 4
    params = [SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p in
              ((1.0, 0, 0.9), (0.7, 50, 1.0), (1.0, 40, 0.8), (1.3, 0, 0.5), (0.6, 1000, 0.95),
               (1.0, 2, 1.0), (1.0, 0, 1e-6), (2.0, 300, 0.7))] * (rows // 8)
    gpu, cpu = token_probs(x.cuda(), params).cpu(), token_probs(x, params)
    moved = ((gpu > 0) ^ (cpu > 0)).nonzero().tolist()
    for r, t in moved:  # the moved token is the least likely of the larger kept set
        assert x[r, t] == x[r][(gpu[r] > 0) | (cpu[r] > 0)].min(), (r, t)
    rows_moved = {r for r, _ in moved}
    assert len(moved) == len(rows_moved) <= rows // 16, moved
    same = [r for r in range(rows) if r not in rows_moved]
    torch.testing.assert_close(gpu[same], cpu[same], rtol=1e-4, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_min_p_rows_stay_above_the_cut() -> None:
    """On CUDA a min_p row leaves the Triton draws (which know no min_p) for token_probs."""
    x = _logits(1, seed=6).cuda().repeat(400, 1)
    p = (x[0] / 1.5).softmax(-1)
    kept = set((p >= 0.2 * p.max()).nonzero().flatten().tolist())
    got = sample_tokens(x, [SamplingParams(temperature=1.5, min_p=0.2)] * 400, list(range(400)))
    assert set(got) <= kept and len(set(got)) > 1


@pytest.mark.gpu
@pytest.mark.parametrize("top_p", [0.8, 1.0])
def test_cuda_kernel_draws_ignore_batch_composition(top_p: float) -> None:
    """On CUDA a seeded temperature/top-p row draws in kernels/sample.py (top_p 1: in
    kernels/sample_temperature.py): its token is the same alone, beside greedy, top-k and
    unseeded rows, and whatever the runner's generator holds."""
    row = _logits(1, seed=1).cuda()
    p = SamplingParams(temperature=0.9, top_p=top_p, seed=42)
    alone = [sample_tokens(row, [p], [pos])[0] for pos in range(30)]
    others = _logits(3, seed=2).cuda()
    mixed = []
    for pos in range(30):
        batch = torch.cat([others[:2], row, others[2:]])
        params = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=5), p,
                  SamplingParams(temperature=0.0)]
        gen = torch.Generator(device="cuda").manual_seed(pos)
        mixed.append(sample_tokens(batch, params, [pos + 3, 5, pos, pos], generator=gen)[2])
    assert alone == mixed
    assert len(set(alone)) > 3
    kept = reference.top_p_probs(row, torch.tensor([p.temperature], device="cuda"),
                                 torch.tensor([p.top_p], device="cuda"))[0].cpu()
    assert all(kept[t] > 0 for t in alone)
