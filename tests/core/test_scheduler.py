"""Scheduler lifecycle with a fake runner; every test ends with the leak check."""

from __future__ import annotations

import random

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Finish, Sequence, SeqStatus
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig

from pdtest.fake_runner import FakeRunner


def make(num_blocks=64, block_size=4, **cfg) -> tuple[Scheduler, FakeRunner]:
    sched = Scheduler(SchedulerConfig(**cfg), BlockManager(num_blocks, block_size))
    return sched, FakeRunner(block_size)


def run_all(sched: Scheduler, runner: FakeRunner, max_steps: int = 10_000) -> dict[str, list[int]]:
    outs: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not sched.has_work:
            break
        step = sched.schedule()
        assert step.num_tokens <= sched.cfg.max_num_batched_tokens
        for ev in sched.update(step, runner.execute(step)):
            outs.setdefault(ev.request_id, []).append(ev.token)
    assert not sched.has_work
    return outs


def leak_check(sched: Scheduler) -> None:
    assert sched.blocks.num_free == sched.blocks.num_total


def seq(rid: str, n: int, max_tokens: int = 8, seed: int = 0) -> Sequence:
    rng = random.Random(seed)
    prompt = [rng.randrange(1000) for _ in range(n)]
    return Sequence(rid, prompt, SamplingParams(temperature=0, max_tokens=max_tokens))


def alone(n: int, max_tokens: int, seed: int) -> list[int]:
    sched, runner = make(num_blocks=2048, block_size=4, max_num_batched_tokens=1 << 20, max_model_len=1 << 20)
    sched.add(seq("x", n, max_tokens, seed))
    return run_all(sched, runner)["x"]


def test_join_and_leave_every_step_matches_solo_runs():
    sched, runner = make(num_blocks=256, max_num_batched_tokens=64)
    specs = [(i, 1 + 7 * i % 30, 1 + (5 * i) % 9) for i in range(12)]
    outs: dict[str, list[int]] = {}
    pending = list(specs)
    while pending or sched.has_work:
        if pending:  # one newcomer per step while others are mid-flight
            i, n, m = pending.pop(0)
            sched.add(seq(f"r{i}", n, m, seed=i))
        step = sched.schedule()
        for ev in sched.update(step, runner.execute(step)):
            outs.setdefault(ev.request_id, []).append(ev.token)
    for i, n, m in specs:
        assert outs[f"r{i}"] == alone(n, m, i)
    leak_check(sched)


def test_preemption_recomputes_and_keeps_tokens():
    sched, runner = make(num_blocks=12, block_size=4, max_num_batched_tokens=256)
    for i in range(4):
        sched.add(seq(f"r{i}", 6, 10, seed=i))
    outs = run_all(sched, runner)
    assert sched.preemptions > 0
    for i in range(4):
        assert outs[f"r{i}"] == alone(6, 10, i)
    leak_check(sched)


def test_chunked_prefill_of_long_prompt():
    sched, runner = make(num_blocks=2048, block_size=16, max_num_batched_tokens=512, max_model_len=8192)
    sched.add(seq("long", 5000, 4, seed=3))
    outs = run_all(sched, runner)
    prefill_steps = [s for s in runner.steps if s.num_tokens > 1]
    assert len(prefill_steps) == 10  # ceil(5000 / 512)
    assert all(s.num_tokens <= 512 for s in runner.steps)
    assert outs["long"] == alone(5000, 4, 3)
    leak_check(sched)


def test_prefix_hit_computes_only_the_tail():
    sched, runner = make(num_blocks=256, block_size=4, max_num_batched_tokens=4096)
    shared = seq("a", 40, 2, seed=9)
    sched.add(shared)
    run_all(sched, runner)
    tail = Sequence("b", shared.prompt_ids + [1, 2, 3], SamplingParams(temperature=0, max_tokens=2))
    sched.add(tail)
    first = sched.schedule()
    assert first.seqs[0].start_pos == 40 and len(first.seqs[0].token_ids) == 3
    assert sched.prefix_hit_tokens == 40
    sched.update(first, runner.execute(first))
    run_all(sched, runner)
    leak_check(sched)


def test_abort_mid_step_frees_at_update():
    sched, runner = make()
    sched.add(seq("a", 9, 50))
    sched.add(seq("b", 5, 50))
    step = sched.schedule()
    assert sched.abort("a")
    events = sched.update(step, runner.execute(step))
    assert any(e.request_id == "a" and e.finish is Finish.ABORT for e in events)
    assert sched.abort("b") and not sched.abort("b")
    assert not sched.has_work
    leak_check(sched)


def test_max_num_seqs_caps_a_step():
    sched, runner = make(num_blocks=512, max_num_seqs=3, max_num_batched_tokens=4096)
    for i in range(7):
        sched.add(seq(f"r{i}", 3, 3, seed=i))
    assert len(sched.schedule().seqs) == 3
    sched2, runner2 = make(num_blocks=512, max_num_seqs=3, max_num_batched_tokens=4096)
    for i in range(7):
        sched2.add(seq(f"r{i}", 3, 3, seed=i))
    run_all(sched2, runner2)
    leak_check(sched2)


def test_preempted_sequence_is_not_starved_by_a_partial_chunk():
    # A decodes while B (a long prompt, chunked) holds most of the pool; when A must preempt
    # itself it lands ahead of B, so B has to give its blocks back or nothing ever runs again.
    sched, runner = make(num_blocks=8, block_size=4, max_num_batched_tokens=8)
    sched.add(seq("a", 4, 20, seed=1))
    step = sched.schedule()
    first = [e.token for e in sched.update(step, runner.execute(step))]
    sched.add(seq("b", 28, 2, seed=2))
    outs = run_all(sched, runner, max_steps=500)
    assert sched.preemptions > 0
    assert first + outs["a"] == alone(4, 20, 1) and outs["b"] == alone(28, 2, 2)
    leak_check(sched)


def test_failed_step_does_not_feed_the_prefix_cache():
    sched, runner = make(num_blocks=64, block_size=4, max_num_batched_tokens=256)
    a = seq("a", 12, 2, seed=4)
    sched.add(a)
    step = sched.schedule()
    sched.fail_step(step)
    events = sched.update(step, runner.execute(step))
    assert [e.finish for e in events] == [Finish.ABORT]
    sched.add(Sequence("b", list(a.prompt_ids), SamplingParams(temperature=0, max_tokens=2)))
    step = sched.schedule()
    assert step.seqs[0].start_pos == 0  # nothing was cached from the failed step
    assert sched.prefix_hit_tokens == 0
    assert sched.abort("b")  # mid-step: freed at update
    sched.update(step, runner.execute(step))
    assert not sched.has_work
    leak_check(sched)


def test_max_num_seqs_bounds_running_every_step():
    sched, runner = make(num_blocks=512, max_num_seqs=3, max_num_batched_tokens=4096)
    for i in range(7):
        sched.add(seq(f"r{i}", 3, 3 + i, seed=i))
    outs: dict[str, list[int]] = {}
    while sched.has_work:
        step = sched.schedule()
        assert len(step.seqs) <= 3 and len(sched.running) <= 3
        for ev in sched.update(step, runner.execute(step)):
            outs.setdefault(ev.request_id, []).append(ev.token)
    assert all(outs[f"r{i}"] == alone(3, 3 + i, i) for i in range(7))
    leak_check(sched)


def _decode_side(sched: Scheduler, runner: FakeRunner, rid: str, prompt: list[int], first: int,
                 max_tokens: int) -> tuple[int, list[int]]:
    """A decode worker's path: reserve with a prefix lookup, the transfer writes only the
    blocks past the cached prefix, the sequence joins the batch with its first token."""
    bs = sched.blocks.block_size
    table, hit = sched.blocks.allocate_prompt(len(prompt), sched.blocks.hashes(prompt))
    for pos in range(hit * bs, len(prompt)):  # what the KV transfer writes
        runner.cache[(table[pos // bs], pos % bs)] = (pos, prompt[pos])
    sched.add(Sequence(rid, list(prompt), SamplingParams(temperature=0, max_tokens=max_tokens),
                       output_ids=[first], block_table=table, num_computed=len(prompt),
                       status=SeqStatus.RUNNING))
    return hit, [first, *run_all(sched, runner)[rid]]


def test_decode_side_prefix_cache_reuses_finished_prompts_and_survives_eviction():
    rng = random.Random(1)
    shared = [rng.randrange(1000) for _ in range(20)]  # 5 blocks of 4
    a, b, c = shared + [1, 2, 3], shared + [7, 8], [rng.randrange(1000) for _ in range(40)]
    want = {}
    for name, p in (("a", a), ("b", b), ("c", c)):  # no cache: a fresh worker each
        s, r = make(num_blocks=64, block_size=4)
        want[name] = _decode_side(s, r, name, p, 5, 6)[1]
    sched, runner = make(num_blocks=14, block_size=4)
    assert _decode_side(sched, runner, "a", a, 5, 6) == (0, want["a"])
    assert _decode_side(sched, runner, "b", b, 5, 6) == (5, want["b"])  # only the tail was sent
    leak_check(sched)  # cached blocks count as free
    assert _decode_side(sched, runner, "c", c, 5, 6) == (0, want["c"])  # 12 blocks: evicts most
    hit, tokens = _decode_side(sched, runner, "b2", b, 5, 6)
    assert hit < 5 and tokens == want["b"]
    leak_check(sched)


def test_steps_that_fit_nothing_are_not_in_flight():
    """A step with no slices (nothing fits the pool yet) is never run or updated: it must not
    count as in flight, or frees would wait for an update that never comes."""
    sched, runner = make(num_blocks=4, block_size=4)
    sched.add(seq("a", 8, 3, seed=1))  # two blocks; its first decode needs a third
    first = sched.schedule()
    sched.update(first, runner.execute(first))
    held = sched.blocks.allocate(2)  # e.g. reserved for a transfer
    empty = sched.schedule()  # a preempts itself and cannot come back yet
    assert empty.seqs == () and not sched.in_step("a") and sched.preemptions == 1
    sched.blocks.free(held)
    assert run_all(sched, runner)["a"]
    leak_check(sched)


def test_token_events_carry_the_step_logprobs():
    """update() hands each sampled token its logprobs from the StepOutput (None where the request
    asked for none); a finishing event carries them too."""
    from pdserve.core.step_io import StepOutput, TokenLogprobs

    sched, runner = make()
    sched.add(Sequence("lp", [5, 6, 7], SamplingParams(temperature=0, max_tokens=2, logprobs=1)))
    sched.add(Sequence("no", [8, 9], SamplingParams(temperature=0, max_tokens=2)))
    seen: dict[str, list] = {}
    while sched.has_work:
        step = sched.schedule()
        out = runner.execute(step)
        lps = {rid: TokenLogprobs(-0.5 - t, ((t, -0.5 - t),)) for rid, t in out.sampled.items() if rid == "lp"}
        for ev in sched.update(step, StepOutput(sampled=out.sampled, logprobs=lps)):
            seen.setdefault(ev.request_id, []).append((ev.token, ev.logprobs, ev.finish))
    assert [lp for _, lp, _ in seen["no"]] == [None, None]
    assert [lp for t, lp, _ in seen["lp"]] == [TokenLogprobs(-0.5 - t, ((t, -0.5 - t),)) for t, _, _ in seen["lp"]]
    assert seen["lp"][-1][2] is Finish.LENGTH
    leak_check(sched)


def test_penalized_slices_carry_their_history():
    """A penalized request's slices carry its tokens before them (prefill, decode and overlapped
    placeholder slices); others carry none."""
    sched, runner = make()
    pen = Sequence("pen", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4, frequency_penalty=1.0))
    sched.add(pen)
    sched.add(Sequence("plain", [8, 9], SamplingParams(temperature=0, max_tokens=4)))
    step = sched.schedule()
    first = {s.request_id: s for s in step.seqs}
    assert (first["pen"].history.tokens(), first["pen"].history.prompt_len) == ([], 3)
    assert first["plain"].history is None
    sched.update(step, runner.execute(step))
    step = sched.schedule()
    dec = {s.request_id: s for s in step.seqs}["pen"]
    assert dec.history.tokens() == [5, 6, 7] and dec.token_ids == (pen.output_ids[-1],)
    nxt = {s.request_id: s for s in sched.schedule_next().seqs}  # step in flight: placeholders
    assert nxt["pen"].prev_row >= 0 and nxt["pen"].history.tokens() == [5, 6, 7, pen.output_ids[-1]]
    assert nxt["plain"].history is None
    sched.update(step, runner.execute(step))
    step = sched._last
    sched.update(step, runner.execute(step))
    run_all(sched, runner)
    leak_check(sched)


def _prompt_entries(step, out):
    """A StepOutput with fake prompt logprobs: each target's logprob is minus its position."""
    from pdserve.core.step_io import StepOutput, TokenLogprobs

    return StepOutput(sampled=out.sampled, prompt_logprobs={
        sl.request_id: tuple(TokenLogprobs(-float(sl.start_pos + 1 + i)) for i in range(len(sl.prompt_targets)))
        for sl in step.seqs if sl.prompt_targets})


def test_prompt_logprobs_gathered_over_chunks_arrive_with_the_first_token():
    """A 10-token prompt in chunks of 4: its slices name the prompt tokens after each position
    (never past the prompt), the first token's event carries the 9 entries in order, a
    recompute from scratch (released mid-prompt) does not repeat them, and a request asking
    prompt logprobs never takes prefix-cache hits (a cached position has no logits)."""
    sched, runner = make(num_blocks=64, block_size=4, max_num_batched_tokens=4)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    prompt = list(range(100, 110))
    sched.add(Sequence("p", prompt, params))
    step = sched.schedule()
    assert step.seqs[0].prompt_targets == tuple(prompt[1:5])
    sched.update(step, _prompt_entries(step, runner.execute(step)))
    sched._release(sched.get("p"))  # as a preemption does to the head of the queue
    events = []
    while sched.has_work:
        step = sched.schedule()
        for sl in step.seqs:
            assert sl.prompt_targets == (tuple(prompt[sl.start_pos + 1 : sl.end_pos + 1]) if sl.start_pos < 10 else ())
        events += sched.update(step, _prompt_entries(step, runner.execute(step)))
    assert [e.logprob for e in events[0].prompt_logprobs] == [-float(i) for i in range(1, 10)]
    assert events[1].prompt_logprobs is None and len(events) == 2
    sched.add(Sequence("again", prompt, params))
    sched.add(Sequence("plain", prompt, SamplingParams(temperature=0, max_tokens=2)))
    first = sched.schedule()
    assert first.seqs[0].start_pos == 0 and sched.prefix_hit_tokens == 0
    sched.update(first, _prompt_entries(first, runner.execute(first)))
    while sched.has_work:
        step = sched.schedule()
        sched.update(step, _prompt_entries(step, runner.execute(step)))
    assert sched.prefix_hit_tokens == 8  # "plain" reused two cached blocks
    leak_check(sched)


def _prio(rid: str, n: int, max_tokens: int, priority: int, seed: int = 0) -> Sequence:
    s = seq(rid, n, max_tokens, seed)
    s.params = SamplingParams(temperature=0, max_tokens=max_tokens, priority=priority)
    return s


def test_priority_orders_the_waiting_queue():
    """Lower priority values are prefilled first; ties first come, first served; the tokens are
    each request's own."""
    sched, runner = make(num_blocks=256, max_num_seqs=1, max_num_batched_tokens=64)
    order = [("a", 0), ("b", 5), ("c", -1), ("d", 5), ("e", 0)]
    for i, (rid, p) in enumerate(order):
        sched.add(_prio(rid, 5, 3, p, seed=i))
    started = []
    outs: dict[str, list[int]] = {}
    while sched.has_work:
        step = sched.schedule()
        started += [sl.request_id for sl in step.seqs if sl.request_id not in started]
        for ev in sched.update(step, runner.execute(step)):
            outs.setdefault(ev.request_id, []).append(ev.token)
    assert started == ["c", "a", "e", "b", "d"]
    assert all(outs[rid] == alone(5, 3, i) for i, (rid, _) in enumerate(order))
    leak_check(sched)


def test_preemption_takes_the_lowest_priority_first():
    """Out of blocks, the running sequence of the highest priority value goes (not the newest),
    and every sequence still gets its own tokens."""
    sched, runner = make(num_blocks=10, block_size=4, max_num_batched_tokens=256)
    sched.add(_prio("low", 6, 12, 3, seed=0))
    sched.add(_prio("high", 6, 12, -2, seed=1))
    sched.add(_prio("mid", 6, 12, 0, seed=2))
    victims = []
    outs: dict[str, list[int]] = {}
    while sched.has_work:
        before = {s.request_id for s in sched.running}
        step = sched.schedule()
        victims += sorted(before - {s.request_id for s in sched.running})
        for ev in sched.update(step, runner.execute(step)):
            outs.setdefault(ev.request_id, []).append(ev.token)
    assert sched.preemptions > 0 and victims and victims[0] == "low" and "high" not in victims
    assert all(outs[rid] == alone(6, 12, i) for i, rid in enumerate(("low", "high", "mid")))
    leak_check(sched)


def test_an_urgent_request_displaces_a_partial_chunk_without_deadlock():
    """A request of lower priority value arriving while the head of the queue holds blocks of a
    partial chunk goes ahead of it; the displaced head gives its blocks back (only the head may
    hold any), so a pool too small for both still serves both."""
    sched, runner = make(num_blocks=8, block_size=4, max_num_batched_tokens=8)
    sched.add(_prio("big", 24, 2, 0, seed=1))
    step = sched.schedule()  # the first 8-token chunk of big: 2 of the 8 blocks
    sched.update(step, runner.execute(step))
    assert sched.waiting[0].request_id == "big" and sched.waiting[0].block_table
    sched.add(_prio("urgent", 20, 6, -1, seed=2))
    assert [s.request_id for s in sched.waiting] == ["urgent", "big"] and not sched.waiting[1].block_table
    outs = run_all(sched, runner, max_steps=500)
    assert outs["urgent"] == alone(20, 6, 2) and outs["big"] == alone(24, 2, 1)
    leak_check(sched)
