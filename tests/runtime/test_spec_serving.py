"""The serving decode path with speculation, in process: Scheduler + DraftPlanner + SpeculativeRunner.

Greedy tokens equal the same scheduler without speculation, with chunked prefills mixed into
verify steps and a pool small enough to preempt; once with pdserve.kernels.reference and once with
the Triton kernels (interpreter on CPU: the varlen prefill kernel serves the 1 + k queries).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Finish, Sequence
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.core.spec_schedule import DraftPlanner
from pdserve.core.speculative import SpeculativeConfig
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_graphs import VerifyGraphs
from pdserve.runtime.spec_step import SpeculativeRunner
from pdtest.masks import bitmask

SPEC = ModelSpec.from_config_dict(dict(
    model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=40, max_position_embeddings=256,
))
CFG = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=3)
PROMPTS = [[1, 2, 3, 4, 5, 6] * 4 + [1, 2], [7] * 12, [9, 8, 7, 9, 8] * 3, [11, 12, 13]]


def serve(runner: ModelRunner, spec: bool, num_blocks: int, params: SamplingParams,
          budget: int = 32, graphs: VerifyGraphs | None = None) -> tuple[dict[str, list[int]], Scheduler]:
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_model_len=200)
    planner = DraftPlanner(CFG, cfg.max_model_len) if spec else None
    sched = Scheduler(cfg, BlockManager(num_blocks, runner.block_size), planner)
    engine = SpeculativeRunner(runner) if spec else runner
    if graphs is not None:
        engine.graphs = graphs
    return drive(sched, engine, PROMPTS, params), sched


def drive(sched: Scheduler, engine, prompts: list[list[int]], params: SamplingParams) -> dict[str, list[int]]:
    """Serve every prompt to the end (request ids "0", "1", ...); tokens per request, then the leak check."""
    for i, p in enumerate(prompts):
        sched.add(Sequence(str(i), list(p), params))
    outs: dict[str, list[int]] = {}
    while sched.has_work:
        step = sched.schedule()
        for ev in sched.update(step, engine.execute(step)):
            outs.setdefault(ev.request_id, []).append(ev.token)
    assert sched.blocks.num_free == sched.blocks.num_total  # the leak check
    return outs


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
    code = "from runtime.test_spec_serving import check_greedy; check_greedy('pdserve.kernels.triton_ops', (64,), 10); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=root / "tests", timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_verify_graph_buffers_equal_eager_verify() -> None:
    """The verify-graph path (K + 1 padded rows per sequence, static buffers; run eagerly on
    CPU) gives the tokens of plain decoding, and its verify steps really took that path."""
    runner = ModelRunner(SPEC, None, num_blocks=64, block_size=4, load_format="dummy", seed=3)
    graphs = VerifyGraphs(runner.model, runner.kv_pool, block_size=4, max_model_len=200,
                          num_speculative_tokens=CFG.num_speculative_tokens, max_num_seqs=4, capture=False)
    runs = []
    real_run = graphs.run
    graphs.run = lambda seqs: runs.append(len(seqs)) or real_run(seqs)  # count graph steps
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain, _ = serve(runner, False, 64, params)
    spec, sched = serve(runner, True, 64, params, graphs=graphs)
    assert spec == plain
    assert runs and sched.spec.stats.accepted > 0
    assert 3 in runs or 4 in runs  # padded batches (3 -> 4) and full ones both served


def test_verify_graph_logits_rows_equal_eager() -> None:
    """Row by row: a step with 0, 1 and K drafts gives the eager path's logits on real rows."""
    import dataclasses

    from pdserve.runtime.spec_step import execute_graphed, execute_speculative

    runner = ModelRunner(SPEC, None, num_blocks=32, block_size=4, load_format="dummy", seed=1)
    greedy = SamplingParams(temperature=0.0)
    prompts = {"a": [3, 4, 5, 6, 7], "b": [9] * 9, "c": [1, 2]}
    tables = {"a": (0, 1, 2), "b": (3, 4, 5, 6), "c": (7, 8)}
    runner.execute(StepInput(tuple(SeqSlice(r, tuple(p), 0, tables[r], greedy) for r, p in prompts.items())))
    step = StepInput((
        SeqSlice("a", (8,), 5, tables["a"], greedy),  # no draft
        SeqSlice("b", (9, 9, 9, 9), 9, tables["b"], greedy, True, (), 3),  # K drafts
        SeqSlice("c", (5, 6), 2, tables["c"], greedy, True, (), 1),
    ))
    graphs = VerifyGraphs(runner.model, runner.kv_pool, block_size=4, max_model_len=32,
                          num_speculative_tokens=3, max_num_seqs=4, capture=False)
    assert graphs.fits(step.seqs)
    logits, firsts = graphs.run(step.seqs)
    got = [logits[f : f + len(s.token_ids)] for s, f in zip(step.seqs, firsts)]
    ids, positions, meta = runner._prepare(step.seqs)
    meta = dataclasses.replace(meta, logits_indices=None, is_decode=False)
    hidden = runner.model.forward(ids, positions, meta, runner.kv_pool)
    want = runner.model.compute_logits(hidden)
    at = 0
    for s, g in zip(step.seqs, got):
        n = len(s.token_ids)
        torch.testing.assert_close(g, want[at : at + n], rtol=1e-4, atol=1e-4)
        at += n
    assert execute_graphed(runner, graphs, step) == execute_speculative(runner, step)


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


class OddGuide:
    """A synthetic guide: only odd token ids (or one fixed id every 5th token) may come next."""

    def __init__(self) -> None:
        self.n = 0

    def ids(self) -> list[int]:
        return [9] if self.n % 5 == 4 else list(range(1, SPEC.vocab_size, 2))

    def allowed(self) -> bytes:
        return bitmask(self.ids(), (SPEC.vocab_size + 7) // 8)

    def accept(self, token: int) -> bool:
        ok = token in self.ids()
        self.n += 1
        return ok


def test_guided_requests_beside_speculated_ones() -> None:
    """A guided request gets no drafts but shares verify steps with drafted ones: its tokens keep
    to its guide (a refused one would abort it) and equal its run without speculation; the
    drafted requests' tokens equal theirs without the guided one."""
    runner = ModelRunner(SPEC, None, num_blocks=64, block_size=4, load_format="dummy", seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)

    def run(spec: bool, guided: bool) -> tuple[dict[str, list[int]], Scheduler]:
        cfg = SchedulerConfig(max_num_batched_tokens=32, max_model_len=200)
        sched = Scheduler(cfg, BlockManager(64, 4), DraftPlanner(CFG, 200) if spec else None)
        engine = SpeculativeRunner(runner) if spec else runner
        for i, p in enumerate(PROMPTS):
            sched.add(Sequence(str(i), list(p), params, guide=OddGuide() if guided and i == 2 else None))
        outs: dict[str, list[int]] = {}
        while sched.has_work:
            step = sched.schedule()
            assert not any(sl.num_drafts for sl in step.seqs if sl.request_id == "2" and guided)
            for ev in sched.update(step, engine.execute(step)):
                outs.setdefault(ev.request_id, []).append(ev.token)
                assert ev.finish in (None, Finish.LENGTH), ev
        assert sched.blocks.num_free == sched.blocks.num_total and sched._guided == 0
        return outs, sched

    spec_guided, sched = run(True, True)
    assert sched.spec.stats.accepted > 0  # the others were speculated
    assert spec_guided["2"] == run(False, True)[0]["2"]
    assert all(t % 2 == 1 for t in spec_guided["2"]) and spec_guided["2"][4::5] == [9] * 4
    free = run(True, False)[0]
    assert {k: v for k, v in spec_guided.items() if k != "2"} == {k: v for k, v in free.items() if k != "2"}
    assert spec_guided["2"] != free["2"]
