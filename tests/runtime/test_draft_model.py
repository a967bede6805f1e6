"""Draft-model speculation in the serving decode path: Scheduler + DraftPlanner(DraftModelProposer)
+ SpeculativeRunner, in process, on tiny random models (CPU, reference ops).

Greedy tokens equal plain decoding whatever the draft model; a draft identical to the target
has (nearly) every draft accepted, which only holds if the draft's own KV bookkeeping (catch-up
after accepted and rejected drafts, preemption of the target) is right; sampling keeps the
distribution (chi-square); the draft pool is returned whole when the requests end.
"""

from __future__ import annotations

from collections import Counter

import pytest
from runtime.test_spec_serving import drive
from runtime.test_speculative import chi2_critical, homogeneity_chi2

from pdserve.core.block_manager import BlockManager
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.core.spec_schedule import DraftPlanner
from pdserve.core.speculative import SpeculativeConfig
from pdserve.model.spec import ModelSpec
from pdserve.runtime.draft_model import DraftModelProposer
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_step import SpeculativeRunner

TARGET = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=40, max_position_embeddings=256)
SMALL = {**TARGET, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "head_dim": 8}
CFG = SpeculativeConfig(method="draft_model", model="(in process)", num_speculative_tokens=3)
PROMPTS = [[1, 2, 3, 4, 5, 6] * 4 + [1, 2], [7] * 12, [9, 8, 7, 9, 8] * 3, [11, 12, 13]]


class StepClock:
    """Every step takes one second: the batch gate decides on acceptance alone (deterministic)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def runner(cfg: dict, seed: int, num_blocks: int = 64) -> ModelRunner:
    return ModelRunner(ModelSpec.from_config_dict(cfg), None, num_blocks=num_blocks, block_size=4,
                       load_format="dummy", seed=seed)


def serve(target: ModelRunner, draft: ModelRunner | None, num_blocks: int, params: SamplingParams,
          prompts: list[list[int]] = PROMPTS) -> tuple[dict[str, list[int]], Scheduler, DraftModelProposer | None]:
    cfg = SchedulerConfig(max_num_batched_tokens=32, max_model_len=200)
    proposer = DraftModelProposer(draft, target.spec.vocab_size) if draft is not None else None
    planner = DraftPlanner(CFG, cfg.max_model_len, StepClock(), proposer) if proposer is not None else None
    sched = Scheduler(cfg, BlockManager(num_blocks, target.block_size), planner)
    outs = drive(sched, SpeculativeRunner(target) if proposer is not None else target, prompts, params)
    if proposer is not None:  # the leak check of the draft pool (drive checked the target's)
        assert proposer.blocks.num_free == proposer.blocks.num_total and not proposer._seqs
    return outs, sched, proposer


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("num_blocks", [64, 20])  # 20: the target preempts by recompute
def test_a_draft_equal_to_the_target_is_always_right(num_blocks: int) -> None:
    target = runner(TARGET, seed=3)
    plain, _, _ = serve(target, None, num_blocks, GREEDY)
    spec, sched, _ = serve(target, runner(TARGET, seed=3), num_blocks, GREEDY)
    assert spec == plain
    st = sched.spec.stats
    assert st.proposed > 40 and st.accepted >= 0.95 * st.proposed, st  # stale draft KV would miss
    assert st.emitted > 2 * st.steps  # several tokens per verify step


def test_another_draft_model_keeps_greedy_tokens() -> None:
    target = runner(TARGET, seed=3)
    plain, _, _ = serve(target, None, 64, GREEDY)
    spec, sched, _ = serve(target, runner(SMALL, seed=11), 64, GREEDY)
    assert spec == plain
    st = sched.spec.stats
    assert st.proposed > 0 and st.accepted < st.proposed, st  # a different model: some rejected


def test_a_full_draft_pool_skips_drafts_not_requests() -> None:
    """A draft pool of 6 blocks holds one prompt at a time: the others go without drafts."""
    target = runner(TARGET, seed=3)
    plain, _, _ = serve(target, None, 64, GREEDY)
    spec, sched, _ = serve(target, runner(TARGET, seed=3, num_blocks=6), 64, GREEDY)
    assert spec == plain and sched.spec.stats.proposed > 0


def test_sampling_distribution_unchanged_with_a_draft_model() -> None:
    """The second output token (the first verified against a draft) has the same distribution
    with and without speculation (chi-square, p = 0.001), with a draft model unlike the target."""
    target = runner(TARGET, seed=3, num_blocks=600)
    params = SamplingParams(temperature=0.8, max_tokens=3, ignore_eos=True)
    prompts = [[5, 6, 7, 8]] * 300
    plain, spec = Counter(), Counter()
    draft = runner(SMALL, seed=11, num_blocks=600)
    proposed = 0
    for _ in range(3):
        plain.update(o[1] for o in serve(target, None, 600, params, prompts)[0].values())
        outs, sched, _ = serve(target, draft, 600, params, prompts)
        spec.update(o[1] for o in outs.values())
        proposed += sched.spec.stats.proposed
    assert proposed > 0
    stat, df = homogeneity_chi2(plain, spec)
    assert stat < chi2_critical(df), (stat, df)


def test_refuses_a_draft_model_with_another_vocabulary() -> None:
    with pytest.raises(ValueError, match="vocab_size 48 differs from the target's 40"):
        DraftModelProposer(runner({**SMALL, "vocab_size": 48}, seed=1), 40)
