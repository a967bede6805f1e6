"""Presence / frequency / repetition penalties: the device counts against a plain loop, greedy
tokens against transformers' repetition penalty, and the overlapped loop (placeholders)."""

from __future__ import annotations

import random
import time

import pytest
import torch
from model.hf_tiny import hf_model, tiny_model  # noqa: F401 (fixture)

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Sequence
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig, TokenEvent
from pdserve.core.step_io import PLACEHOLDER, History, SeqSlice
from pdserve.model.spec import ModelSpec
from pdserve.runtime.loop import EngineLoop
from pdserve.runtime.offline import generate
from pdserve.runtime.penalties import PenaltyCounts, process
from pdserve.runtime.runner import ModelRunner


def _reference(row: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams) -> torch.Tensor:
    """One row penalized token by token (the definitions, no tensors of counts)."""
    out = row.clone().double()
    for t in set(prompt) | set(output):
        out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    for t in set(output):
        out[t] -= p.presence_penalty + p.frequency_penalty * output.count(t)
    return out


def test_penalize_counts_history_own_tokens_and_placeholders() -> None:
    rng = random.Random(0)
    vocab = 30
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(0)) * 3
    prev_tokens = torch.tensor([7, 11, 7], dtype=torch.int32)
    both = SamplingParams(presence_penalty=0.5, frequency_penalty=0.7, repetition_penalty=1.8)
    prompt0 = [rng.randrange(vocab) for _ in range(9)]
    out0 = [rng.randrange(vocab) for _ in range(6)] + [7, 7]
    slices = [
        # a prefill's last chunk: prompt tokens 0..3 in history, 4..8 its own
        SeqSlice("pre", tuple(prompt0[4:]), 4, (0,), both, history=History(prompt0, [], 4)),
        SeqSlice("off", (1, 2, 3), 0, (0,), SamplingParams(temperature=0.0)),  # not penalized: untouched
        # a decode slice: its token is the newest output
        SeqSlice("dec", (out0[-1],), 16, (0,), both, history=History(prompt0, out0, 16)),
        # a placeholder: its token is the previous step's row 1 (11)
        SeqSlice("ph", (PLACEHOLDER,), 17, (0,), SamplingParams(frequency_penalty=-1.5), True, (), 0, 1,
                 History(prompt0, out0, 17)),
        SeqSlice("rep", (4,), 3, (0,), SamplingParams(repetition_penalty=0.5), history=History([4, 5], [6, 4], 3)),
    ]
    got = process(logits, slices, prev_tokens)
    want = [
        _reference(logits[0], prompt0, [], both),
        logits[1].double(),
        _reference(logits[2], prompt0, out0, both),
        _reference(logits[3], prompt0, out0 + [11], slices[3].sampling),
        _reference(logits[4], [4, 5], [6, 4], slices[4].sampling),
    ]
    for r, w in enumerate(want):
        assert torch.allclose(got[r].double(), w, atol=1e-5), r
    alone = logits[1:2]
    assert process(alone, [slices[1]]) is alone  # nothing biased or penalized: the same tensor
    with pytest.raises(ValueError, match="placeholder"):
        process(logits[3:4], [slices[3]], None)


def test_counts_kept_between_steps_equal_counting_afresh() -> None:
    """The runner's PenaltyCounts (2 rows for 3 requests: rows are taken back least recently used
    first, and a request whose row went is counted again from its history) give every step the
    logits a count from scratch gives, through a prefill split in two chunks and decode steps."""
    g = torch.Generator().manual_seed(2)
    p = SamplingParams(presence_penalty=0.4, frequency_penalty=0.9, repetition_penalty=1.3)
    prompts = {rid: [int(t) for t in torch.randint(0, 20, (6,), generator=g)] for rid in "abc"}
    outs: dict[str, list[int]] = {rid: [] for rid in "abc"}
    kept = PenaltyCounts(20, "cpu", slots=2)
    plan = [("a", "b"), ("a", "c"), ("b", "c"), ("a", "b"), ("c", "a*"), ("a", "c")]  # a*: a recomputed
    for step in plan:
        slices = []
        for rid in step:
            rid, recompute = rid[0], rid.endswith("*")
            seq, out = prompts[rid], outs[rid]
            if recompute:  # after a preemption: again from position 3 (blocks before it in the prefix cache)
                slices.append(SeqSlice(rid, tuple(seq + out)[3:], 3, (0,), p, history=History(seq, out, 3)))
            elif not out:  # the prompt's second chunk (the first, positions 0-2, sampled nothing)
                slices.append(SeqSlice(rid, tuple(seq[3:]), 3, (0,), p, history=History(seq, out, 3)))
            else:
                start = len(seq) + len(out) - 1
                slices.append(SeqSlice(rid, (out[-1],), start, (0,), p, history=History(seq, out, start)))
        logits = torch.randn(len(slices), 20, generator=g)
        got = process(logits, slices, None, kept)
        assert torch.allclose(got, process(logits, slices)), step
        for rid, row in zip(step, got):
            outs[rid[0]].append(int(row.argmax()))
    assert kept._where.keys() == {"a", "c"}


def test_greedy_repetition_penalty_equals_transformers(tiny_model) -> None:  # noqa: F811 (fixture)
    path = tiny_model("llama")
    hf = hf_model(path)
    runner = ModelRunner(ModelSpec.from_dir(path), path, num_blocks=64, block_size=4)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    for penalty in (1.0, 1.6, 0.7):
        ids = torch.tensor([prompt])
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                           min_new_tokens=12, repetition_penalty=penalty, eos_token_id=None, pad_token_id=0)
        got = generate(runner, [prompt], SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=penalty))
        assert got[0] == want[0, len(prompt):].tolist(), penalty
    plain = generate(runner, [prompt], SamplingParams(temperature=0.0, max_tokens=12))[0]
    strong = generate(runner, [prompt], SamplingParams(temperature=0.0, max_tokens=12, frequency_penalty=2.0,
                                                       presence_penalty=2.0))[0]
    assert strong != plain and len(set(strong)) > len(set(plain))


SPEC = ModelSpec.from_config_dict(dict(
    model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=50, max_position_embeddings=256,
))


def _requests() -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(3)
    return [([rng.randrange(50) for _ in range(3 + 4 * i)],
             SamplingParams(temperature=0.0, max_tokens=20, frequency_penalty=0.4 * (i % 3), presence_penalty=0.3,
                            repetition_penalty=1.0 + 0.2 * i)) for i in range(6)]


def _loop_tokens(runner: ModelRunner, overlap: bool) -> dict[str, list[int]]:
    """Every request of _requests() through an engine loop; checks placeholders were (not) used."""
    sched = Scheduler(SchedulerConfig(max_model_len=256), BlockManager(runner.num_blocks, runner.block_size))
    loop, got, done, placeholders = EngineLoop(sched, runner, overlap=overlap), {}, [], []
    real = runner.launch
    runner.launch = lambda step, hook=None: (placeholders.extend(s.prev_row for s in step.seqs), real(step, hook))[1]
    loop._launch = runner.launch if overlap else None

    def sink(ev: TokenEvent) -> None:
        got.setdefault(ev.request_id, []).append(ev.token)
        if ev.finish is not None:
            done.append(ev.request_id)

    requests = _requests()
    for i, (prompt, params) in enumerate(requests):
        loop.submit(Sequence(f"r{i}", prompt, params), sink)
    loop.start()
    try:
        deadline = time.monotonic() + 60
        while len(done) < len(requests) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.stop()
    assert len(done) == len(requests)
    assert sched.blocks.num_free == sched.blocks.num_total
    assert (max(placeholders) >= 0) == overlap
    return got


def test_overlapped_loop_penalizes_placeholder_tokens() -> None:
    """The overlapped loop (placeholder slices: the newest token read on the device) gives the
    plain loop's tokens, and the offline generator's, for penalized greedy requests."""
    make = lambda: ModelRunner(SPEC, None, num_blocks=200, block_size=4, load_format="dummy", seed=1)  # noqa: E731
    plain, overlapped = _loop_tokens(make(), False), _loop_tokens(make(), True)
    assert plain == overlapped
    ref = make()
    for i, (prompt, params) in enumerate(_requests()):
        assert plain[f"r{i}"] == generate(ref, [prompt], params)[0], i


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_loop_penalized_overlapped_equals_plain() -> None:
    """On the GPU (CUDA graphs, bf16, penalties on the graph's logits): overlapped == plain."""
    make = lambda: ModelRunner(SPEC, None, device="cuda", dtype=torch.bfloat16, num_blocks=200,  # noqa: E731
                               block_size=16, load_format="dummy", seed=1, max_model_len=256, max_num_seqs=8)
    assert _loop_tokens(make(), False) == _loop_tokens(make(), True)


def test_logit_bias_moves_greedy_and_drawn_tokens() -> None:
    """-100 on each row's best token hands greedy to the runner-up; +100 on a token makes it
    every draw's (a drawn row: temperature 1); rows without a bias are untouched."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    best = logits.argmax(-1).tolist()
    slices = [SeqSlice("a", (1,), 0, (0,), SamplingParams(temperature=0.0, logit_bias=((best[0], -100.0),))),
              SeqSlice("b", (1,), 0, (0,), SamplingParams(temperature=1.0, logit_bias=((7, 100.0), (8, -3.0)))),
              SeqSlice("c", (1,), 0, (0,), SamplingParams(temperature=0.0))]
    out = process(logits, slices)
    assert out[0].argmax() == logits[0].topk(2).indices[1]
    assert out[1, 7] == logits[1, 7] + 100 and out[1, 8] == logits[1, 8] - 3
    assert torch.equal(out[2], logits[2]) and torch.equal(logits[0].argmax(), torch.tensor(best[0]))
    from pdserve.runtime.sampler import sample_tokens
    draws = sample_tokens(out[1:2].expand(200, -1), [slices[1].sampling] * 200, list(range(200)))
    assert set(draws) == {7}


def test_bias_then_penalties_leave_the_input_alone() -> None:
    """A row with a logit bias and penalties: the bias first, then the penalties on the biased
    logits (penalized in the biased copy); the caller's logits are untouched."""
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(4))
    kept = logits.clone()
    pen = dict(presence_penalty=0.5, repetition_penalty=1.5)
    both = SeqSlice("b", (3,), 2, (0,), SamplingParams(logit_bias=((3, 2.0), (9, -1.0)), **pen),
                    history=History([3, 4], [], 2))
    plain = SeqSlice("p", (5,), 0, (0,), SamplingParams(temperature=0.0))
    got = process(logits, [both, plain])
    biased = logits.clone()
    biased[0, 3] += 2.0
    biased[0, 9] -= 1.0
    want = process(biased, [SeqSlice("b", (3,), 2, (0,), SamplingParams(**pen), history=History([3, 4], [], 2)), plain])
    assert torch.equal(got, want) and torch.equal(logits, kept)


def test_gpu_kv_budget_leaves_room_for_the_penalty_counts(monkeypatch) -> None:
    """On CUDA the KV pool is sized without the [max_num_seqs, vocab] counts a penalized request
    allocates later: each extra sequence slot costs the pool vocab x 5 bytes (memory faked)."""
    import argparse

    from pdserve.runtime.kv_cache import block_bytes
    from pdserve.runtime.penalties import PenaltyCounts
    from pdserve.worker import _num_blocks, add_worker_args

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 << 30, 80 << 30))
    p = argparse.ArgumentParser()
    add_worker_args(p)
    blocks = {}
    for seqs in (1, 1024):
        args = p.parse_args(["--port", "0", "--max-num-seqs", str(seqs), "--block-size", "16"])
        blocks[seqs] = _num_blocks(args, SPEC, torch.bfloat16, torch.device("cuda"))
    per_block = block_bytes(SPEC, 16, torch.bfloat16)
    lost = PenaltyCounts.nbytes(1024, SPEC.vocab_size) - PenaltyCounts.nbytes(1, SPEC.vocab_size)
    assert blocks[1] - blocks[1024] in (lost // per_block, lost // per_block + 1)
    assert lost // per_block > 0


def _compiled_variants(kernel) -> int:
    """How many compiled variants a Triton kernel holds (its per-device caches)."""
    return sum(len(entry[0]) for entry in kernel.device_caches.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_warm_up_compiles_the_penalties_kernel_a_penalized_step_uses() -> None:
    """After warm_up, a penalized bf16 step (prefill, then a graphed decode) compiles no new
    variant of the penalties kernel, and the runner's own counts are still unallocated until
    then."""
    from pdserve.kernels.penalties import _penalties_kernel

    r = ModelRunner(SPEC, None, device="cuda", dtype=torch.bfloat16, num_blocks=64, block_size=16,
                    load_format="dummy", seed=1, max_model_len=256, max_num_seqs=8)
    r.warm_up()
    assert r.penalty_counts._counts is None
    compiled = _compiled_variants(_penalties_kernel)
    assert compiled > 0
    p = SamplingParams(temperature=0.0, max_tokens=4, repetition_penalty=1.3, presence_penalty=0.5)
    generate(r, [[3, 4, 5, 3, 4], [7, 8, 9]], p)
    assert _compiled_variants(_penalties_kernel) == compiled
