"""Structured output in the scheduler (no torch, no model): each sampled slice carries its
sequence's guide mask, the guide sees every sampled token, overlap and drafts stay off while a
guided sequence runs, and a token the guide refuses ends the request."""

from __future__ import annotations

import pytest

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Finish, Sequence, SeqStatus
from pdserve.core.sampling import Guide, GuideKind, SamplingParams, ValidationError
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.core.spec_schedule import draft_limit
from pdserve.core.step_io import StepOutput
from pdtest.masks import allowed_ids, bitmask

VOCAB = 64


class EvenGuide:
    """Allows the even tokens below a bound that shrinks by 2 with each token accepted."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def allowed(self) -> bytes:
        return bitmask(list(range(0, max(2, VOCAB - 2 * len(self.accepted)), 2)), VOCAB // 8)

    def accept(self, token: int) -> bool:
        if token % 2:
            return False
        self.accepted.append(token)
        return True


def make(guided: bool, rid: str = "g", max_tokens: int = 5) -> Sequence:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return Sequence(rid, [1, 2, 3], params, eos_ids=(63,), guide=EvenGuide() if guided else None)


def scheduler() -> Scheduler:
    return Scheduler(SchedulerConfig(max_model_len=64), BlockManager(32, 4))


def test_each_sampled_slice_carries_the_mask_of_its_guide_state():
    sched, seq, free = scheduler(), make(True), make(False, "f")
    sched.add(seq)
    sched.add(free)
    for n in range(5):
        step = sched.schedule()
        by_id = {sl.request_id: sl for sl in step.seqs}
        assert by_id["f"].allowed is None
        assert allowed_ids(by_id["g"].allowed) == list(range(0, max(2, VOCAB - 2 * n), 2))
        sched.update(step, StepOutput(sampled={"g": 2 * n, "f": 7}))
    assert seq.guide.accepted == [0, 2, 4, 6, 8] and seq.finish is Finish.LENGTH
    assert sched._guided == 0 and sched.blocks.num_free == sched.blocks.num_total


def test_a_steps_masks_come_from_one_guide_masks_call():
    calls: list[int] = []

    def masks(guides):
        calls.append(len(guides))
        return [g.allowed() for g in guides]

    sched = Scheduler(SchedulerConfig(max_model_len=64), BlockManager(32, 4), guide_masks=masks)
    for rid in ("a", "b", "c"):
        sched.add(make(rid != "b", rid, max_tokens=2))
    step = sched.schedule()
    assert calls == [2] and [sl.allowed is not None for sl in step.seqs] == [True, False, True]
    sched.update(step, StepOutput(sampled={"a": 0, "b": 1, "c": 2}))
    sched.update(sched.schedule(), StepOutput(sampled={"a": 0, "b": 1, "c": 2}))
    assert calls == [2, 2] and not sched.has_work and sched._guided == 0
    sched.update(sched.schedule(), StepOutput())
    assert calls == [2, 2]  # no guided sequence: no call


def test_a_chunked_prompt_gets_a_mask_only_on_its_sampled_chunk():
    sched = Scheduler(SchedulerConfig(max_model_len=64, max_num_batched_tokens=4), BlockManager(32, 4))
    seq = Sequence("g", list(range(1, 8)), SamplingParams(temperature=0.0, max_tokens=2), guide=EvenGuide())
    sched.add(seq)
    first = sched.schedule()
    assert not first.seqs[0].sample and first.seqs[0].allowed is None
    sched.update(first, StepOutput())
    last = sched.schedule()
    assert last.seqs[0].sample and allowed_ids(last.seqs[0].allowed)[:2] == [0, 2]


def test_an_overlapped_step_leaves_guided_masks_pending_until_the_step_before_is_applied():
    sched = scheduler()
    sched.add(make(False, "f", max_tokens=20))
    sched.add(make(True, "g", max_tokens=3))
    first = sched.schedule()
    assert {sl.request_id: sl.allowed is not None for sl in first.seqs} == {"f": False, "g": True}
    nxt = sched.schedule_next()  # g's mask needs the token first samples
    by_id = {sl.request_id: sl for sl in nxt.seqs}
    assert by_id["g"].mask_pending and by_id["g"].allowed is None and by_id["g"].prev_row >= 0
    assert not by_id["f"].mask_pending
    sched.update(first, StepOutput(sampled={"f": 7, "g": 0}))
    masks = sched.pending_masks(nxt)
    assert list(masks) == ["g"] and allowed_ids(masks["g"]) == list(range(0, VOCAB - 2, 2))  # one token in
    sched.update(nxt, StepOutput(sampled={"f": 7, "g": 2}))
    third = sched.schedule_next() or sched.schedule()
    sched.update(third, StepOutput(sampled={"f": 7, "g": 4}))  # g ends (max_tokens 3)
    assert sched.get("g") is None and sched._guided == 0


def test_a_sequence_ended_meanwhile_gets_no_pending_mask():
    sched = scheduler()
    sched.add(make(True, "g", max_tokens=20))
    first = sched.schedule()
    nxt = sched.schedule_next()
    assert nxt.seqs[0].mask_pending
    sched.abort("g")  # in a step: ends at its update
    sched.update(first, StepOutput(sampled={"g": 0}))
    assert sched.pending_masks(nxt) == {}
    sched.update(nxt, StepOutput(sampled={"g": 1}))  # its token is dropped, not fed to the guide
    assert sched._guided == 0 and sched.blocks.num_free == sched.blocks.num_total


def test_a_token_the_guide_refuses_aborts_the_request_and_leaks_nothing():
    sched, seq = scheduler(), make(True)
    sched.add(seq)
    step = sched.schedule()
    events = sched.update(step, StepOutput(sampled={"g": 5}))  # odd: EvenGuide refuses it
    assert [(e.token, e.finish) for e in events] == [(5, Finish.ABORT)]
    assert sched._guided == 0 and not sched.has_work
    assert sched.blocks.num_free == sched.blocks.num_total


def test_aborting_a_guided_request_releases_it():
    sched, seq = scheduler(), make(True)
    sched.add(seq)
    sched.update(sched.schedule(), StepOutput(sampled={"g": 0}))
    assert sched.abort("g") and sched._guided == 0
    assert sched.blocks.num_free == sched.blocks.num_total


def test_guided_sequences_get_no_drafts():
    seq = make(True, max_tokens=20)
    seq.status, seq.output_ids = SeqStatus.RUNNING, [0]
    assert draft_limit(seq, 4, 64) == 0
    assert draft_limit(make(False, max_tokens=20), 4, 64) == 4


@pytest.mark.parametrize("guide, why", [
    (Guide(GuideKind.REGEX, ""), "empty"),
    (Guide(GuideKind.GRAMMAR, "x" * (64 * 1024 + 1)), "characters"),
    (Guide(GuideKind.JSON, "{not json"), "does not parse"),
    (Guide(GuideKind.JSON, "[1, 2]"), "must be an object"),
    (Guide(GuideKind.CHOICE, "[]"), "non-empty list"),
    (Guide(GuideKind.CHOICE, '["a", 3]'), "non-empty list"),
    (Guide(GuideKind.CHOICE, '["a", ""]'), "non-empty list"),
    (Guide(GuideKind.CHOICE, '"a"'), "non-empty list"),
])
def test_bad_guides_are_refused_naming_the_field(guide, why):
    with pytest.raises(ValidationError, match=why) as err:
        SamplingParams(guide=guide).validate()
    assert err.value.field == "guide"


def test_min_tokens_cannot_be_combined_with_a_guide():
    with pytest.raises(ValidationError) as err:
        SamplingParams(min_tokens=2, guide=Guide(GuideKind.REGEX, "a+")).validate()
    assert err.value.field == "min_tokens"
    SamplingParams(guide=Guide(GuideKind.JSON, "{}")).validate()
