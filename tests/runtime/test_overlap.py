"""Overlapped engine loop: step N+1 is planned and queued before step N's tokens are applied.

Tokens equal the plain loop's (and each request's solo run), EOS, min_tokens, max_model_len and
aborts land where they would without overlap, and every block comes back (leak check)."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Finish, Sequence
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig, TokenEvent
from pdserve.core.step_io import PLACEHOLDER, SeqSlice, StepInput
from pdserve.model.spec import ModelSpec
from pdserve.runtime.loop import EngineLoop
from pdserve.runtime.runner import ModelRunner

from pdtest.fake_runner import FakeRunner

EOS = tuple(range(0, 1000, 23))  # ~4 % of the fake runner's tokens end a request
MAX_LEN = 120


def request(i: int) -> Sequence:
    rng = random.Random(i)
    n = MAX_LEN - 6 if i == 5 else 1 + rng.randrange(40)  # request 5 ends at max_model_len
    params = SamplingParams(temperature=0, max_tokens=1 + rng.randrange(30), min_tokens=8 if i % 4 == 1 else 0)
    return Sequence(f"r{i}", [rng.randrange(1000) for _ in range(n)], params, eos_ids=EOS)


def solo(i: int) -> tuple[list[int], Finish]:
    """Request i alone through a plain scheduler: the tokens every loop must give it."""
    sched = Scheduler(SchedulerConfig(max_model_len=MAX_LEN), BlockManager(512, 4))
    runner, seq = FakeRunner(4), request(i)
    sched.add(seq)
    toks: list[int] = []
    while sched.has_work:
        step = sched.schedule()
        toks += [e.token for e in sched.update(step, runner.execute(step))]
    return toks, seq.finish


class Collector:
    """Sinks that record each request's events; `wait` returns once n requests ended."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.finish: dict[str, Finish] = {}
        self.cond = threading.Condition()
        self.on_token = lambda ev: None

    def sink(self, ev: TokenEvent) -> None:
        with self.cond:
            if ev.token >= 0:
                self.tokens.setdefault(ev.request_id, []).append(ev.token)
            if ev.finish is not None:
                self.finish[ev.request_id] = ev.finish
                self.cond.notify_all()
        self.on_token(ev)

    def wait(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.finish) >= n, timeout=30), self.finish


def run(runner, overlap: bool, n: int = 24, abort_after: dict[str, int] | None = None,
        sched: Scheduler | None = None) -> tuple[Collector, Scheduler]:
    """n requests, the second half submitted while the first half decodes; abort_after[rid]:
    abort that request once it has that many tokens."""
    sched = sched or Scheduler(SchedulerConfig(max_model_len=MAX_LEN, max_num_batched_tokens=96),
                               BlockManager(400, 4))
    loop, got = EngineLoop(sched, runner, overlap=overlap), Collector()
    abort_after = abort_after or {}
    later = [request(i) for i in range(n // 2, n)]

    def on_token(ev: TokenEvent) -> None:  # on the loop thread, outside its lock (as RPCs are)
        if ev.request_id == "r0" and len(got.tokens.get("r0", ())) == 2:
            for seq in later:
                loop.submit(seq, got.sink)
        if abort_after.get(ev.request_id) == len(got.tokens.get(ev.request_id, ())):
            loop.abort(ev.request_id)

    got.on_token = on_token
    loop.start()
    try:
        for i in range(n // 2):
            loop.submit(request(i), got.sink)
        got.wait(n)
    finally:
        loop.stop()
    assert not sched.has_work and not sched._inflight
    assert sched.blocks.num_free == sched.blocks.num_total  # leak check
    return got, sched


def test_fake_model_overlapped_equals_solo_runs() -> None:
    runner = FakeRunner(4)
    got, _ = run(runner, overlap=True)
    for i in range(24):
        toks, finish = solo(i)
        assert got.tokens.get(f"r{i}", []) == toks, i
        assert got.finish[f"r{i}"] is finish, i
    assert runner.placeholders > 0  # steps really were planned before their tokens were known
    assert any(f is Finish.STOP for f in got.finish.values())
    assert got.finish["r5"] is Finish.LENGTH and len(got.tokens["r5"]) <= 6


def test_plain_loop_plans_nothing_ahead() -> None:
    runner = FakeRunner(4)
    got, _ = run(runner, overlap=False)
    assert runner.placeholders == 0
    assert all(got.tokens.get(f"r{i}", []) == solo(i)[0] for i in range(24))


def test_aborts_while_two_steps_are_in_flight() -> None:
    runner = FakeRunner(4)
    abort_after = {"r2": 1, "r3": 3, "r14": 2}
    got, _ = run(runner, overlap=True, abort_after=abort_after)
    assert list(got.finish.values()).count(Finish.ABORT) >= 2
    for rid, k in abort_after.items():
        full = solo(int(rid[1:]))[0]
        if len(full) <= k:  # it ended on its own first
            continue
        assert got.finish[rid] is Finish.ABORT
        assert got.tokens[rid] == full[: len(got.tokens[rid])] and len(got.tokens[rid]) >= k


def test_schedule_next_rows_newcomers_and_deferred_frees() -> None:
    """Unit view: placeholders point at the in-flight step's rows; a newcomer stops planning
    ahead; a request ending in one step keeps its blocks until the step after it is applied."""
    sched, runner = Scheduler(SchedulerConfig(), BlockManager(16, 4)), FakeRunner(4)
    for rid, prompt in (("a", [1, 2, 3, 4, 5]), ("b", [4, 5])):
        sched.add(Sequence(rid, prompt, SamplingParams(temperature=0, max_tokens=6)))
    first = sched.schedule()
    nxt = sched.schedule_next()
    assert [(s.request_id, s.token_ids, s.start_pos, s.prev_row) for s in nxt.seqs] == [
        ("a", (PLACEHOLDER,), 5, 0), ("b", (PLACEHOLDER,), 2, 1)]
    assert len(nxt.seqs[0].block_table) == 2  # position 5 needed a second block
    assert sched.schedule_next() is None  # two steps in flight already
    assert sched.abort("b") and sched.in_step("b")
    free = sched.blocks.num_free
    events = sched.update(first, runner.execute(first))
    assert [(e.request_id, e.finish) for e in events] == [("a", None), ("b", Finish.ABORT)]
    assert sched.blocks.num_free == free  # b's blocks: the planned step still writes them
    sched.add(Sequence("c", [7], SamplingParams(temperature=0, max_tokens=2)))
    assert sched.schedule_next() is None  # c waits: the next step is a plain one
    events = sched.update(nxt, runner.execute(nxt))
    assert [e.request_id for e in events] == ["a"]  # b's planned token is dropped
    assert sched.blocks.num_free == free + 1 and not sched.in_step("b")
    while sched.has_work:
        step = sched.schedule()
        sched.update(step, runner.execute(step))
    assert sched.blocks.num_free == sched.blocks.num_total


def test_tiny_model_overlapped_equals_plain() -> None:
    """The real runner (CPU, reference ops): placeholders filled on the device give the tokens
    of the plain loop."""
    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256,
    ))
    outs = []
    for overlap in (False, True):
        runner = ModelRunner(spec, None, num_blocks=400, block_size=4, load_format="dummy", seed=1)
        got, _ = run(runner, overlap=overlap, n=10)
        outs.append((got.tokens, got.finish))
    assert outs[0] == outs[1]
    assert sum(map(len, outs[0][0].values())) > 50


def test_runner_refuses_a_placeholder_the_last_step_did_not_sample() -> None:
    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, vocab_size=100, max_position_embeddings=64,
    ))
    r = ModelRunner(spec, None, num_blocks=8, block_size=4, load_format="dummy")
    greedy = SamplingParams(temperature=0)
    first = StepInput((SeqSlice("a", (5, 6, 7), 0, (0,), greedy), SeqSlice("b", (8,), 0, (1,), greedy)))
    out = r.execute(first)
    nxt = StepInput((SeqSlice("b", (PLACEHOLDER,), 1, (1,), greedy, prev_row=1),))
    want = r.execute(StepInput((SeqSlice("b", (out.sampled["b"],), 1, (1,), greedy),))).sampled
    r.execute(first)  # the same state again, then the placeholder form
    assert r.execute(nxt).sampled == want
    with pytest.raises(ValueError, match="did not sample"):
        r.execute(StepInput((SeqSlice("a", (PLACEHOLDER,), 3, (0,), greedy, prev_row=1),)))
    with pytest.raises(ValueError, match="did not sample"):
        r.execute(StepInput((SeqSlice("a", (PLACEHOLDER,), 3, (0,), greedy, prev_row=7),)))


@pytest.mark.gpu
def test_cuda_graph_loop_overlapped_equals_plain() -> None:
    """On the GPU (CUDA graphs, bf16): the overlapped loop's greedy tokens equal the plain
    loop's. Lengths only (no EOS), all submitted at once, so both loops run the same batches."""
    import torch

    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512,
    ))
    outs, placeholders = [], []
    for overlap in (False, True):
        runner = ModelRunner(spec, None, device="cuda", dtype=torch.bfloat16, num_blocks=512, block_size=16,
                             load_format="dummy", seed=1, max_model_len=512, max_num_seqs=16)
        sched = Scheduler(SchedulerConfig(max_model_len=512, max_num_seqs=16), BlockManager(512, 16))
        loop, got = EngineLoop(sched, runner, overlap=overlap), Collector()
        rng = random.Random(0)
        for i in range(12):
            params = SamplingParams(temperature=0, max_tokens=5 + 7 * i, ignore_eos=True)
            loop.submit(Sequence(f"r{i}", [rng.randrange(1000) for _ in range(3 + 11 * i)], params), got.sink)
        launches = []
        real_launch = runner.launch
        runner.launch = lambda step, hook=None: (launches.append(step), real_launch(step, hook))[1]
        loop._launch = runner.launch if overlap else None
        loop.start()
        try:
            got.wait(12)
        finally:
            loop.stop()
        assert sched.blocks.num_free == sched.blocks.num_total
        outs.append(got.tokens)
        placeholders.append(sum(s.prev_row >= 0 for st in launches for s in st.seqs))
    assert outs[0] == outs[1]
    assert placeholders[0] == 0 and placeholders[1] > 100


@pytest.mark.gpu
def test_cuda_graph_decode_launches_sampled_rows_without_host_sync() -> None:
    """The deliverable 'no host synchronisation in a decode step other than reading the sampled
    tokens' with sampled requests too: every decode launch of the overlapped loop (temperature,
    top-k/top-p, seeds, a stop id suppressed before min_tokens, beside greedy rows) runs with
    CUDA's synchronizing calls turned into errors, and every request still ends by length."""
    import torch

    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512,
    ))
    runner = ModelRunner(spec, None, device="cuda", dtype=torch.bfloat16, num_blocks=512, block_size=16,
                         load_format="dummy", seed=1, max_model_len=512, max_num_seqs=16)
    sched = Scheduler(SchedulerConfig(max_model_len=512, max_num_seqs=16), BlockManager(512, 16))
    loop, got = EngineLoop(sched, runner, overlap=True), Collector()
    checked = []
    real_launch = runner.launch

    def launch(step, hook=None):
        if not all(len(s.token_ids) == 1 for s in step.seqs):
            return real_launch(step, hook)  # prefill steps are not under the rule
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = real_launch(step, hook)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        checked.append(sum(not s.sampling.greedy for s in step.seqs if s.sample))
        return out

    runner.launch = launch
    loop._launch = launch
    kinds = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=20, seed=3),
             SamplingParams(temperature=1.0, top_p=0.8), SamplingParams(temperature=0.0),
             SamplingParams(temperature=1.0, min_tokens=1, stop_token_ids=(5,))]
    rng = random.Random(0)
    for i in range(10):
        kind, n = kinds[i % len(kinds)], 30 + 3 * i
        # min_tokens = max_tokens: the stop id stays suppressed on every step, the length exact
        params = dataclasses.replace(kind, max_tokens=n, min_tokens=n if kind.min_tokens else 0, ignore_eos=True)
        loop.submit(Sequence(f"r{i}", [rng.randrange(1000) for _ in range(5 + 9 * i)], params), got.sink)
    loop.start()
    try:
        got.wait(10)
    finally:
        loop.stop()
    assert sched.blocks.num_free == sched.blocks.num_total
    assert all(len(got.tokens[f"r{i}"]) == 30 + 3 * i for i in range(10)), {k: len(v) for k, v in got.tokens.items()}
    assert len(checked) > 20 and sum(checked) > 100, checked
