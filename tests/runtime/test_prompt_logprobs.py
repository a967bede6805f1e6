"""Prompt logprobs: the runner against transformers (chunked, in pieces, beside sampled rows and
drafts), and the engine loop delivering them with the first token, prefix cache or not."""

from __future__ import annotations

import time

import pytest
import torch
from model.hf_tiny import hf_model, tiny_model  # noqa: F401 (fixture)

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Sequence
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig, TokenEvent
from pdserve.core.step_io import SeqSlice, StepInput, TokenLogprobs
from pdserve.model.spec import ModelSpec
from pdserve.runtime import prompt_logprobs as prompt_module
from pdserve.runtime.loop import EngineLoop
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_step import execute_speculative

PROMPTS = {"a": [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46], "b": [26, 43, 38, 32, 7, 9], "c": [11, 12, 13]}


def _want(hf, prompt: list[int], k: int) -> list[TokenLogprobs]:
    """transformers' log-softmax at each prompt token after the first, with the top k."""
    with torch.no_grad():
        lp = hf(torch.tensor([prompt])).logits[0].double().log_softmax(-1)
    out = []
    for j in range(1, len(prompt)):
        top = lp[j - 1].topk(k) if k else None
        pairs = () if top is None else tuple(zip(top.indices.tolist(), top.values.tolist()))
        rank = 1 + int((lp[j - 1] > lp[j - 1, prompt[j]]).sum())
        out.append(TokenLogprobs(lp[j - 1, prompt[j]].item(), pairs, rank))
    return out


def _close(got: tuple[TokenLogprobs, ...], want: list[TokenLogprobs], tol: float = 1e-4) -> None:
    assert len(got) == len(want)
    assert [g.rank for g in got] == [w.rank for w in want] and all(g.rank >= 1 for g in got)
    for g, w in zip(got, want):
        assert g.logprob == pytest.approx(w.logprob, abs=tol)
        assert [t for t, _ in g.top] == [t for t, _ in w.top]
        assert [v for _, v in g.top] == pytest.approx([v for _, v in w.top], abs=tol)


def _slice(rid: str, start: int, end: int, table: tuple[int, ...], params: SamplingParams, **kw) -> SeqSlice:
    p = PROMPTS[rid]
    targets = tuple(p[start + 1 : min(end + 1, len(p))]) if params.prompt_logprobs is not None else ()
    return SeqSlice(rid, tuple(p[start:end]), start, table, params, end == len(p), prompt_targets=targets, **kw)


@pytest.mark.parametrize("piece", [256, 2])
def test_runner_prompt_logprobs_equal_transformers(tiny_model, monkeypatch, piece) -> None:  # noqa: F811
    """'a' in two chunks (the first not sampled) asking 3 alternatives, 'b' whole asking none,
    'c' asking no prompt logprobs, side by side; with lm_head pieces of 2 rows too."""
    monkeypatch.setattr(prompt_module, "PIECE_ROWS", piece)
    path = tiny_model("llama")
    hf = hf_model(path)
    runner = ModelRunner(ModelSpec.from_dir(path), path, num_blocks=32, block_size=4)
    pa, pb = SamplingParams(temperature=0.0, prompt_logprobs=3), SamplingParams(temperature=0.0, prompt_logprobs=0)
    plain = SamplingParams(temperature=0.0, logprobs=2)
    tables = {"a": (0, 1, 2), "b": (3, 4), "c": (5,)}
    first = runner.execute(StepInput((_slice("a", 0, 4, tables["a"], pa), _slice("b", 0, 6, tables["b"], pb),
                                      _slice("c", 0, 3, tables["c"], plain))))
    assert set(first.prompt_logprobs) == {"a", "b"} and set(first.sampled) == {"b", "c"}
    second = runner.execute(StepInput((_slice("a", 4, 11, tables["a"], pa),)))
    got_a = first.prompt_logprobs["a"] + second.prompt_logprobs["a"]
    _close(got_a, _want(hf, PROMPTS["a"], 3))
    _close(first.prompt_logprobs["b"], _want(hf, PROMPTS["b"], 0))
    # the sampled rows are still the last positions' (their logprobs too)
    with torch.no_grad():
        last = hf(torch.tensor([PROMPTS["c"]])).logits[0, -1]
    assert first.sampled["c"] == int(last.argmax())
    assert first.logprobs["c"].logprob == pytest.approx(last.double().log_softmax(-1).max().item(), abs=1e-4)
    assert second.sampled["a"] == int(hf(torch.tensor([PROMPTS["a"]])).logits[0, -1].argmax())


def test_speculative_step_reports_prompt_logprobs(tiny_model) -> None:  # noqa: F811 (fixture)
    """A verify step (one slice with 2 drafts) beside a prompt asking prompt logprobs: the
    prompt's entries equal the plain runner's, the drafted slice is verified as before."""
    path = tiny_model("llama")
    spec = ModelSpec.from_dir(path)
    make = lambda: ModelRunner(spec, path, num_blocks=32, block_size=4)  # noqa: E731
    greedy, asks = SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, prompt_logprobs=2)
    runner = make()
    runner.execute(StepInput((_slice("c", 0, 3, (5,), greedy),)))
    drafted = SeqSlice("c", (13, 40, 41), 2, (5, 6), greedy, num_drafts=2)
    out = execute_speculative(runner, StepInput((drafted, _slice("a", 0, 11, (0, 1, 2), asks))))
    assert "c" in out.emitted and set(out.prompt_logprobs) == {"a"}
    plain = make().execute(StepInput((_slice("a", 0, 11, (0, 1, 2), asks),)))
    _close(out.prompt_logprobs["a"], list(plain.prompt_logprobs["a"]), tol=1e-5)
    assert out.sampled["a"] == plain.sampled["a"]


def _loop_events(runner: ModelRunner, requests: list[tuple[str, list[int], SamplingParams]],
                 budget: int) -> tuple[dict[str, list[TokenEvent]], Scheduler]:
    """Every request through an engine loop one after another (so the later ones find the
    earlier ones' blocks in the prefix cache), chunked at `budget` tokens a step."""
    sched = Scheduler(SchedulerConfig(max_model_len=128, max_num_batched_tokens=budget),
                      BlockManager(runner.num_blocks, runner.block_size))
    loop, got = EngineLoop(sched, runner), {}
    loop.start()
    try:
        for rid, prompt, params in requests:
            loop.submit(Sequence(rid, list(prompt), params), lambda ev: got.setdefault(ev.request_id, []).append(ev))
            deadline = time.monotonic() + 60
            while not (got.get(rid) and got[rid][-1].finish is not None) and time.monotonic() < deadline:
                time.sleep(0.005)
            assert got[rid][-1].finish is not None, rid
    finally:
        loop.stop()
    assert sched.blocks.num_free == sched.blocks.num_total
    return got, sched


def test_engine_loop_delivers_prompt_logprobs_with_the_first_token(tiny_model) -> None:  # noqa: F811
    """Chunked prefill (5 tokens a step): the first token's event carries all the prompt's
    entries, no later event any. The same prompt again with prompt logprobs is computed from
    position 0 (a prefix-cache hit has no logits) and gives the same entries; without them it
    reuses the cached blocks."""
    path = tiny_model("llama")
    hf = hf_model(path)
    runner = ModelRunner(ModelSpec.from_dir(path), path, num_blocks=64, block_size=4)
    asks = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=4, ignore_eos=True)
    plain = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    prompt = PROMPTS["a"] * 2
    events, sched = _loop_events(runner, [("x", prompt, asks), ("y", prompt, asks), ("z", prompt, plain)], budget=5)
    want = _want(hf, prompt, 4)
    for rid in ("x", "y"):
        first, *rest = events[rid]
        _close(first.prompt_logprobs, want)
        assert all(ev.prompt_logprobs is None for ev in rest) and len(events[rid]) == 3
    assert events["z"][0].prompt_logprobs is None
    assert [e.token for e in events["x"]] == [e.token for e in events["y"]] == [e.token for e in events["z"]]
    assert sched.prefix_hit_tokens == 20  # z's five cached blocks of 4; y found none


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_prompt_logprobs_equal_cpu(tiny_model) -> None:  # noqa: F811 (fixture)
    """On CUDA (Triton kernels, CUDA graphs on): float32 prompt logprobs equal the CPU runner's,
    and a one-token chunk asking for them is not sent to a decode graph (which has no rows for
    them) but still reports its entry."""
    torch.backends.cuda.matmul.allow_tf32 = False
    path = tiny_model("llama")
    spec = ModelSpec.from_dir(path)
    asks = SamplingParams(temperature=0.0, prompt_logprobs=5)
    gpu = ModelRunner(spec, path, device="cuda", dtype=torch.float32, num_blocks=32, block_size=4, max_num_seqs=8)
    cpu = ModelRunner(spec, path, num_blocks=32, block_size=4)
    chunks = [(0, 4), (4, 5), (5, 11)]
    got: dict[str, list] = {"cuda": [], "cpu": []}
    for name, r in (("cuda", gpu), ("cpu", cpu)):
        for start, end in chunks:
            step = StepInput((_slice("a", start, end, (0, 1, 2), asks),))
            assert not r.graphed(step)
            got[name] += r.execute(step).prompt_logprobs["a"]
    assert len(got["cuda"]) == 10
    _close(tuple(got["cuda"]), got["cpu"], tol=1e-3)


@pytest.mark.parametrize("targets", [(5, 6, 7, 8), (5, 320), (-1,)])
def test_runner_refuses_prompt_targets_it_cannot_serve(tiny_model, targets) -> None:  # noqa: F811
    """More targets than the slice has positions (their rows would be another slice's), or an
    id outside the vocabulary (an out-of-range gather): ValueError before anything runs."""
    path = tiny_model("llama")
    runner = ModelRunner(ModelSpec.from_dir(path), path, num_blocks=8, block_size=4)
    sl = SeqSlice("a", (3, 4, 5), 0, (0,), SamplingParams(prompt_logprobs=1), prompt_targets=targets)
    with pytest.raises(ValueError, match="prompt targets"):
        runner.execute(StepInput((sl,)))
