"""The whole-batch speculation gate: acceptance back-off, plain baselines, cost per token."""

from __future__ import annotations

from collections.abc import Callable

from pdserve.core.spec_gate import MIN_SAMPLES, REFRESH, BatchGate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# A step: drafting? -> (seconds it takes, drafts proposed, drafts accepted)
Step = Callable[[bool], tuple[float, int, int]]


def drive(gate: BatchGate, clock: Clock, batch: int, step: Step, n: int) -> list[bool]:
    """Run n steps of `batch` sequences; the gate's answer per step."""
    answers = []
    for _ in range(n):
        drafting = gate.allow(batch)
        answers.append(drafting)
        seconds, proposed, accepted = step(drafting)
        gate.record(proposed, accepted)
        clock.now += seconds
    return answers


def plain_or(verify: tuple[float, int, int]) -> Step:
    return lambda drafting: verify if drafting else (1.0, 0, 0)


def pauses(answers: list[bool]) -> list[int]:
    """Lengths of the runs of plain steps (each closed by a drafting step)."""
    runs, n = [], 0
    for a in answers:
        if a:
            if n:
                runs.append(n)
            n = 0
        else:
            n += 1
    return runs


def test_a_bucket_drafts_at_once_then_takes_a_plain_step_every_refresh() -> None:
    clock = Clock()
    gate = BatchGate(clock)
    answers = drive(gate, clock, 8, plain_or((1.0, 16, 16)), MIN_SAMPLES + 1 + 3 * REFRESH)
    assert answers[: MIN_SAMPLES + 1] == [True] * MIN_SAMPLES + [False]  # a first plain sample
    assert answers[MIN_SAMPLES + 1 :] == ([True] * (REFRESH - 1) + [False]) * 3  # one in REFRESH


def test_misses_pause_fourfold_and_good_steps_halve_the_next_pause() -> None:
    clock = Clock()
    gate = BatchGate(clock)
    answers = drive(gate, clock, 8, plain_or((1.0, 8, 1)), 100)  # 1/8 accepted: misses
    assert pauses(answers)[:4] == [1, 4, 16, 64]
    gate = BatchGate(clock)
    good = {"on": False}

    def step(drafting: bool) -> tuple[float, int, int]:
        if not drafting:
            return 1.0, 0, 0
        return (1.0, 8, 8) if good["on"] else (1.0, 8, 0)

    drive(gate, clock, 8, step, 8)  # misses at steps 1, 3 and 8: a pause of 16, the next 64
    assert drive(gate, clock, 8, step, 16) == [False] * 16
    good["on"] = True
    assert drive(gate, clock, 8, step, 3) == [True] * 3  # the next pause: 64 -> 32 -> 16 -> 8
    good["on"] = False
    assert drive(gate, clock, 8, step, 10) == [True] + [False] * 8 + [True]


def test_verify_steps_dearer_per_token_stop_drafting_however_much_they_accept() -> None:
    """Every draft accepted, but a verify step takes 4x a plain one for 2x the tokens."""
    clock = Clock()
    gate = BatchGate(clock)
    answers = drive(gate, clock, 32, plain_or((4.0, 32, 32)), 400)
    assert sum(answers) <= 10, sum(answers)  # the cost found out after 3 verify steps
    runs = pauses(answers)
    assert runs[0] == 1 and runs[-1] >= 64


def test_verify_steps_cheaper_per_token_keep_drafting() -> None:
    clock = Clock()
    gate = BatchGate(clock)
    answers = drive(gate, clock, 32, plain_or((1.5, 32, 32)), 200)  # 1.5x the time, 2x the tokens
    assert sum(answers) >= 200 - 200 // REFRESH - 2


def test_batch_sizes_keep_separate_costs() -> None:
    """Verify steps are dear at batch 32 and cheap at batch 1: drafting stops at 32 only."""
    clock = Clock()
    gate = BatchGate(clock)
    drive(gate, clock, 32, plain_or((4.0, 32, 32)), 20)  # batch 32 learns verify is dear
    answers = drive(gate, clock, 1, plain_or((1.2, 4, 4)), 300)  # batch 1: 5 tokens for 1.2x
    assert sum(answers[-100:]) >= 90  # the back-off left over from batch 32 has worn off


def test_steps_without_drafts_are_plain_samples_and_teach_no_miss() -> None:
    clock = Clock()
    gate = BatchGate(clock)
    answers = drive(gate, clock, 4, lambda drafting: (1.0, 0, 0), 100)  # nothing ever proposed
    assert pauses(answers) == [1, 1, 1]  # the first plain sample and the refresh steps only
