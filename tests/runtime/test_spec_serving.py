"""The serving decode path with speculation, in process: Scheduler + DraftPlanner + SpeculativeRunner.

Greedy tokens equal the same scheduler without speculation, with chunked prefills mixed into
verify steps and a pool small enough to preempt; once with kernels.reference and once with
the Triton kernels (interpreter on CPU: the varlen prefill kernel serves the 1 + k queries).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Sequence
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.core.spec_schedule import DraftPlanner
from pdserve.core.speculative import SpeculativeConfig
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_step import SpeculativeRunner

SPEC = ModelSpec.from_config_dict(dict(
    model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=40, max_position_embeddings=256,
))
CFG = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=3)
PROMPTS = [[1, 2, 3, 4, 5, 6] * 4 + [1, 2], [7] * 12, [9, 8, 7, 9, 8] * 3, [11, 12, 13]]


def serve(runner: ModelRunner, spec: bool, num_blocks: int, params: SamplingParams,
          budget: int = 32) -> tuple[dict[str, list[int]], Scheduler]:
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_model_len=200)
    planner = DraftPlanner(CFG, cfg.max_model_len) if spec else None
    sched = Scheduler(cfg, BlockManager(num_blocks, runner.block_size), planner)
    engine = SpeculativeRunner(runner) if spec else runner
    for i, p in enumerate(PROMPTS):
        sched.add(Sequence(str(i), list(p), params))
    outs: dict[str, list[int]] = {}
    while sched.has_work:
        step = sched.schedule()
        for ev in sched.update(step, engine.execute(step)):
            outs.setdefault(ev.request_id, []).append(ev.token)
    assert sched.blocks.num_free == sched.blocks.num_total  # the leak check
    return outs, sched


def check_greedy(ops_name: str | None, pools: tuple[int, ...] = (64, 20), max_tokens: int = 24) -> None:
    import importlib

    ops = importlib.import_module(ops_name) if ops_name else None
    runner = ModelRunner(SPEC, None, num_blocks=64, block_size=4, load_format="dummy", seed=3, ops=ops)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for num_blocks in pools:  # 20: preemption by recompute
        plain, _ = serve(runner, False, num_blocks, params)
        spec, sched = serve(runner, True, num_blocks, params)
        assert spec == plain, num_blocks
        st = sched.spec.stats
        assert st.accepted > 0 and st.emitted > st.steps, st


def test_greedy_equals_plain_reference_ops() -> None:
    check_greedy(None)


@pytest.mark.slow
def test_greedy_equals_plain_triton_interpreter() -> None:
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{root}{os.pathsep}{root / 'tests'}")
    code = "from runtime.test_spec_serving import check_greedy; check_greedy('kernels.triton_ops', (64,), 10); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=root / "tests", timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_sampled_and_seeded_requests_with_drafts() -> None:
    """Non-greedy rows take the exact rejection-sampling path; a seeded request repeats itself."""
    runner = ModelRunner(SPEC, None, num_blocks=64, block_size=4, load_format="dummy", seed=3)
    params = SamplingParams(temperature=0.7, max_tokens=20, ignore_eos=True, seed=5)
    a, sched = serve(runner, True, 64, params)
    b, _ = serve(runner, True, 64, params)
    assert a == b and all(len(o) == 20 for o in a.values())
    assert sched.spec.stats.proposed > 0


def test_refuses_drafts_without_a_sampled_row() -> None:
    runner = ModelRunner(SPEC, None, num_blocks=8, block_size=4, load_format="dummy")
    bad = SeqSlice("x", (1, 2, 3), 0, (0,), SamplingParams(temperature=0.0), False, (), 2)
    with pytest.raises(ValueError, match="num_drafts"):
        SpeculativeRunner(runner).execute(StepInput((bad,)))
