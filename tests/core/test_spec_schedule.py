"""Speculative decoding in the scheduler (pure Python, no torch): drafts, verify, rollback.

The stand-in model's next token depends on the last two tokens it reads back from its
paged 'cache', so a stale or misplaced KV slot changes the output, and n-gram drafts get
accepted once the sequence starts repeating.
"""

from __future__ import annotations

import random

import pytest

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Finish, Sequence
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.core.spec_schedule import DraftPlanner, draft_limit
from pdserve.core.speculative import SpeculativeConfig
from pdserve.core.step_io import StepInput, StepOutput
from pdtest.fake_runner import FakeRunner

VOCAB = 13
EOS = 12


class RuleRunner(FakeRunner):
    """Greedy 'model': next = (2a + b) mod VOCAB of the last two cached tokens; verifies drafts."""

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size, VOCAB)

    def execute(self, step: StepInput, layer_hook=None) -> StepOutput:
        sampled, emitted = {}, {}
        for sl in step.seqs:
            self._write(sl)
            if not sl.sample:
                continue
            first = sl.end_pos - sl.num_drafts  # position predicted by the first row
            targets = [self._next(sl.block_table, p, sl.suppress_token_ids) for p in range(first, sl.end_pos + 1)]
            if not sl.num_drafts:
                sampled[sl.request_id] = targets[0]
                continue
            out = []
            for d, t in zip(sl.token_ids[-sl.num_drafts:], targets):
                if d != t:
                    break
                out.append(d)
            out.append(targets[len(out)])
            emitted[sl.request_id] = tuple(out)
        return StepOutput(sampled, emitted)

    def _next(self, table: tuple[int, ...], pos: int, suppress: tuple[int, ...]) -> int:
        a = self._read(table, pos - 1)
        b = self._read(table, pos - 2) if pos >= 2 else 0
        tok = (2 * a + b) % VOCAB
        while tok in suppress:
            tok = (tok + 1) % VOCAB
        return tok


CFG = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=1)


class StepClock:
    """Every step takes one second, whatever it carries: a verify step is never dearer per
    token than a plain one, so only acceptance moves the batch gate (deterministic tests)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def make(spec: bool, num_blocks: int = 256, block_size: int = 4, **cfg) -> tuple[Scheduler, RuleRunner]:
    sc = SchedulerConfig(**{"max_model_len": 512, **cfg})
    planner = DraftPlanner(CFG, sc.max_model_len, StepClock()) if spec else None
    return Scheduler(sc, BlockManager(num_blocks, block_size), planner), RuleRunner(block_size)


def run_all(sched: Scheduler, runner: RuleRunner, seqs: list[Sequence]) -> tuple[dict, dict, int, bool]:
    """Outputs and finishes per request, engine steps, and whether a finish cut a verified run."""
    for s in seqs:
        sched.add(s)
    outs: dict[str, list[int]] = {}
    finishes: dict[str, Finish] = {}
    steps, cut = 0, False
    while sched.has_work:
        step = sched.schedule()
        out = runner.execute(step)
        steps += 1
        events = sched.update(step, out)
        for ev in events:
            outs.setdefault(ev.request_id, []).append(ev.token)
            if ev.finish is not None:
                finishes[ev.request_id] = ev.finish
                n_events = sum(e.request_id == ev.request_id for e in events)
                cut |= n_events < len(out.emitted.get(ev.request_id, ()))
        for s in sched.running:  # rollback: no sequence keeps blocks beyond its tokens
            assert len(s.block_table) <= sched.blocks.blocks_for(len(s)), s.request_id
        assert steps < 5000
    assert sched.blocks.num_free == sched.blocks.num_total  # the leak check
    return outs, finishes, steps, cut


def workload(params: SamplingParams, n: int = 6) -> list[Sequence]:
    rng = random.Random(7)
    return [Sequence(f"r{i}", [rng.randrange(VOCAB - 1) for _ in range(3 + 5 * i)], params, (EOS,))
            for i in range(n)]


def test_greedy_outputs_equal_plain_and_fewer_steps() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
    plain, _, plain_steps, _ = run_all(*make(False), workload(params))
    sched, runner = make(True)
    spec, _, spec_steps, _ = run_all(sched, runner, workload(params))
    assert spec == plain
    st = sched.spec.stats
    assert st.accepted > 0 and st.proposed > st.accepted  # both accepted and rejected drafts
    assert spec_steps < plain_steps
    assert sum(st.accepted_per_pos) == st.accepted and st.accepted_per_pos[0] >= st.accepted_per_pos[-1]


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 17])
def test_max_tokens_never_exceeded(max_tokens: int) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    plain, _, _, _ = run_all(*make(False), workload(params))
    spec, fin, _, _ = run_all(*make(True), workload(params))
    assert spec == plain and all(len(o) == max_tokens for o in spec.values())
    assert set(fin.values()) == {Finish.LENGTH}


def rule_sequence(n: int, a: int = 1, b: int = 2) -> list[int]:
    out = [b, a]
    while len(out) < n:
        out.append((2 * out[-1] + out[-2]) % VOCAB)
    return out


def test_stop_token_inside_an_accepted_run() -> None:
    prompt = rule_sequence(64)  # the rule's own cycle: every draft from the prompt is right
    free = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    ref, _, _, _ = run_all(*make(False), [Sequence("r", prompt, free)])
    j = next(i for i in range(2, 5) if ref["r"][i] not in ref["r"][:i])
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop_token_ids=(ref["r"][j],))
    plain, plain_fin, _, _ = run_all(*make(False), [Sequence("r", prompt, params)])
    spec, spec_fin, _, cut = run_all(*make(True), [Sequence("r", prompt, params)])
    assert spec == plain == {"r": ref["r"][: j + 1]} and spec_fin == plain_fin == {"r": Finish.STOP}
    assert cut, "the stop did not fall inside a verified run; the test lost its point"


def test_min_tokens_suppresses_eos_on_every_verified_row() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=50, min_tokens=20)
    plain, plain_fin, _, _ = run_all(*make(False), workload(params))
    sched, runner = make(True)
    spec, spec_fin, _, _ = run_all(sched, runner, workload(params))
    assert spec == plain and spec_fin == plain_fin
    assert all(EOS not in o[:20] for o in spec.values())
    assert sched.spec.stats.accepted > 0


def test_tight_pool_and_budget_match_plain() -> None:
    """Few blocks (preemption by recompute) and a small token budget (mixed prefill chunks)."""
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    kw = dict(num_blocks=24, block_size=4, max_num_batched_tokens=16)
    plain, _, _, _ = run_all(*make(False, **kw), workload(params))
    sched, runner = make(True, **kw)
    spec, _, _, _ = run_all(sched, runner, workload(params))
    assert spec == plain and sched.spec.stats.accepted > 0


def test_abort_mid_flight_frees_everything() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    sched, runner = make(True)
    for s in workload(params):
        sched.add(s)
    for _ in range(30):
        step = sched.schedule()
        sched.update(step, runner.execute(step))
    assert sched.spec.stats.steps > 0
    for rid in list(sched._by_id):
        sched.abort(rid)
    assert not sched.has_work and sched.blocks.num_free == sched.blocks.num_total
    assert not sched.spec._props  # proposers are dropped with their requests


def test_draft_limit() -> None:
    def s(out: int, max_tokens: int = 10, min_tokens: int = 0, prompt: int = 5) -> Sequence:
        return Sequence("x", [1] * prompt, SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens),
                        output_ids=[2] * out)

    assert draft_limit(s(1), 4, 100) == 4
    assert draft_limit(s(7), 4, 100) == 2  # 2 drafts + 1 bonus = the 3 tokens left
    assert draft_limit(s(9), 4, 100) == 0
    assert draft_limit(s(1, prompt=95), 4, 100) == 3  # positions stay below max_model_len
    assert draft_limit(s(1, min_tokens=4), 4, 100) == 2  # verified rows all below min_tokens
    assert draft_limit(s(4, min_tokens=4), 4, 100) == 4


@pytest.mark.parametrize("text, key", [
    ('{"method": "ngram", "num_speculative_tokens": 4, "foo": 1}', "'foo'"),
    ('{"method": "eagle"}', "method"),
    ('{"num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"num_speculative_tokens": "4"}', "num_speculative_tokens"),
    ('{"num_speculative_tokens": true}', "num_speculative_tokens"),
    ('{"prompt_lookup_min": 3, "prompt_lookup_max": 2}', "prompt_lookup_max"),
    ('{"prompt_lookup_min": 0}', "prompt_lookup_min"),
    ('{"method": "ngram",', "JSON"),
    ('[1, 2]', "object"),
])
def test_bad_speculative_config_names_the_key(text: str, key: str) -> None:
    with pytest.raises(ValueError, match="--speculative-config") as e:
        SpeculativeConfig.parse(text)
    assert key in str(e.value)


def test_speculative_config_as_vllm() -> None:
    cfg = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, '
                                  '"prompt_lookup_min": 2}')
    assert (cfg.num_speculative_tokens, cfg.prompt_lookup_max, cfg.prompt_lookup_min) == (5, 4, 2)
    assert SpeculativeConfig.parse('{"prompt_lookup_max": 3}').prompt_lookup_min == 3  # one sets both
    assert SpeculativeConfig.parse("") is None


def test_draft_model_config() -> None:
    cfg = SpeculativeConfig.parse('{"model": "/m/draft", "num_speculative_tokens": 3}')  # vLLM's form
    assert (cfg.method, cfg.model, cfg.num_speculative_tokens) == ("draft_model", "/m/draft", 3)
    with pytest.raises(ValueError, match="'draft_model' needs model"):
        SpeculativeConfig.parse('{"method": "draft_model"}')
    with pytest.raises(ValueError, match="model is for method 'draft_model', not 'ngram'"):
        SpeculativeConfig.parse('{"method": "ngram", "model": "/m/draft"}')
    with pytest.raises(ValueError, match="model must be a string"):
        SpeculativeConfig.parse('{"model": 3}')
    with pytest.raises(ValueError, match="method 'eagle' is not supported"):
        SpeculativeConfig.parse('{"method": "eagle"}')


class NoisyRunner(RuleRunner):
    """A 'model' whose next token is a pseudo-random function of the position: drafts (almost)
    never match, like n-gram lookup on text that does not repeat."""

    def _next(self, table: tuple[int, ...], pos: int, suppress: tuple[int, ...]) -> int:
        tok = random.Random(pos * 7919).randrange(VOCAB - 1)
        while tok in suppress:
            tok = (tok + 1) % VOCAB
        return tok


def test_batch_stops_drafting_while_drafts_keep_failing() -> None:
    """A verify step costs every sequence of the batch: on text the lookup cannot predict, the
    batch drafts in a handful of steps only, and the tokens are those of plain decoding."""
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    sc = SchedulerConfig(max_model_len=512)
    planner = DraftPlanner(CFG, sc.max_model_len, StepClock())
    sched, runner = Scheduler(sc, BlockManager(512, 4), planner), NoisyRunner(4)
    drafting_steps = 0
    for s in workload(params):
        sched.add(s)
    outs: dict[str, list[int]] = {}
    while sched.has_work:
        step = sched.schedule()
        drafting_steps += any(sl.num_drafts for sl in step.seqs)
        for ev in sched.update(step, runner.execute(step)):
            outs.setdefault(ev.request_id, []).append(ev.token)
    assert planner.stats.acceptance_rate < 0.25
    assert drafting_steps <= 12, drafting_steps
    plain_outs, _, _, _ = run_all(*_noisy(False), workload(params))
    assert outs == plain_outs
    assert sched.blocks.num_free == sched.blocks.num_total


def _noisy(spec: bool) -> tuple[Scheduler, NoisyRunner]:
    sched, _ = make(spec, num_blocks=512)
    return sched, NoisyRunner(4)


@pytest.mark.parametrize("kw", [dict(logprobs=0), dict(repetition_penalty=1.2), dict(presence_penalty=-1.0),
                                dict(logit_bias=((3, 5.0),))])
def test_requests_with_logprobs_or_penalties_get_no_drafts(kw) -> None:
    """A verify step reports no logprobs and applies no penalties, so such requests are never
    speculated (the same request without them is)."""
    seq = Sequence("x", [1] * 5, SamplingParams(max_tokens=10, **kw), output_ids=[2])
    assert draft_limit(seq, 4, 100) == 0
    assert draft_limit(Sequence("x", [1] * 5, SamplingParams(max_tokens=10), output_ids=[2]), 4, 100) == 4
