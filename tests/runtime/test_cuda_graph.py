"""CUDA-graph decode: host-side padding (CPU) and graph == eager greedy tokens (GPU)."""

from __future__ import annotations

import pytest
import torch
from model.hf_tiny import tiny_model  # noqa: F401 (fixture)

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import SeqSlice
from pdserve.runtime.cuda_graph import capture_sizes, decode_rows, padded_size
from pdserve.runtime.staging import flat_slot_mapping

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def test_capture_sizes_and_padding() -> None:
    assert capture_sizes(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert capture_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    assert capture_sizes(1) == (1,)
    assert capture_sizes(512)[-2:] == (256, 512)
    sizes = capture_sizes(48)
    assert [padded_size(n, sizes) for n in (1, 3, 5, 17, 33, 48, 49)] == [1, 4, 8, 32, 48, 48, None]


def test_decode_rows_pad_to_nowhere() -> None:
    seqs = (
        SeqSlice("a", (11,), 5, (7, 3), GREEDY),  # position 5: block index 1 (id 3), offset 1
        SeqSlice("b", (12,), 0, (9,), GREEDY),
        SeqSlice("c", (13,), 8, (1, 2, 6, 8), GREEDY),  # needs 3 blocks; table wider
    )
    rows = decode_rows(seqs, 4, 4)
    p = rows.padded
    ids, pos, slots, lens = (rows.vectors[i * p : (i + 1) * p] for i in range(4))
    assert (p, rows.width) == (4, 3)
    assert ids == [11, 12, 13, 0]
    assert pos == [5, 0, 8, 0]
    assert slots == [3 * 4 + 1, 9 * 4, 6 * 4, -1]  # padded row writes nowhere
    assert lens == [6, 1, 9, 1]  # padded row reads one token
    assert rows.tables == [7, 3, 0, 9, 0, 0, 1, 2, 6, 0, 0, 0]


def test_decode_rows_refuses_prefill_and_overflow() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        decode_rows((SeqSlice("a", (1, 2), 0, (0,), GREEDY),), 4, 1)
    with pytest.raises(ValueError, match="do not fit"):
        decode_rows((SeqSlice("a", (1,), 0, (0,), GREEDY),) * 3, 4, 2)


def test_flat_slot_mapping_crosses_blocks() -> None:
    assert flat_slot_mapping((5, 2, 9), 3, 10, 4) == [23, 8, 9, 10, 11, 36, 37]
    assert flat_slot_mapping((5,), 0, 0, 4) == []


def test_static_buffers_match_eager_across_steps() -> None:
    """DecodeGraphs' buffers without capture (CPU, reference ops): real rows' logits equal the
    eager step's, step after step, while rows move, tables grow and a request gets new blocks."""
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.cuda_graph import DecodeGraphs
    from pdserve.runtime.runner import ModelRunner

    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
    ))
    r = ModelRunner(spec, None, num_blocks=41, block_size=4, load_format="dummy")  # block 40: padding
    r.kv_pool.normal_()
    g = DecodeGraphs(r.model, r.kv_pool, block_size=4, max_model_len=64, max_num_seqs=8, capture=False)
    a, b, c = (SeqSlice("a", (5,), 9, (1, 2, 3), GREEDY), SeqSlice("b", (7,), 0, (4,), GREEDY),
               SeqSlice("c", (9,), 20, tuple(range(10, 16)), GREEDY))
    steps = [(a, b, c), (b, a), (SeqSlice("a", (6,), 12, (1, 2, 3, 17), GREEDY), c, b),
             (SeqSlice("b", (8,), 1, (30, 31), GREEDY),), (a, b, c, SeqSlice("d", (3,), 2, (5,), GREEDY))]
    pool0 = r.kv_pool.clone()
    with torch.inference_mode():
        for seqs in steps:
            r.kv_pool.copy_(pool0)
            padded = g.stage(seqs)
            got = g.forward(padded)[: len(seqs)]
            r.kv_pool.copy_(pool0)
            ids, pos, meta = r._prepare(seqs)
            want = r.model.compute_logits(r.model.forward(ids, pos, meta, r.kv_pool))
            assert padded == padded_size(len(seqs), g.sizes)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="outside the pool"):
        g.stage((SeqSlice("e", (1,), 0, (41,), GREEDY),))
    # placeholders: rows whose token the previous step sampled, read from prev_tokens in the forward
    g.prev_tokens[:3] = torch.tensor([11, 5, 42], dtype=torch.int32)
    held = (SeqSlice("a", (-1,), 9, (1, 2, 3), GREEDY, prev_row=2), b, SeqSlice("c", (-1,), 20, c.block_table,
                                                                                 GREEDY, prev_row=1))
    given = (SeqSlice("a", (42,), 9, (1, 2, 3), GREEDY), b, SeqSlice("c", (5,), 20, c.block_table, GREEDY))
    with torch.inference_mode():
        got = [g.forward(g.stage(seqs))[:3].clone() for seqs in (held, given)]
    torch.testing.assert_close(got[0], got[1], rtol=0, atol=0)
    assert not torch.equal(got[0][0], g.forward(g.stage((a, b, c)))[0])  # token 5 != 42: it mattered


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["llama3_rope", "qwen3", "qwen2_moe", "qwen3_moe"])
def test_graph_decode_equals_eager(kind, tiny_model) -> None:  # noqa: F811 (fixture)
    """Mixed prompt lengths, batch 5 (captured: 1, 2, 4, 8): graph and eager give equal tokens."""
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.offline import generate
    from pdserve.runtime.runner import ModelRunner

    torch.backends.cuda.matmul.allow_tf32 = False
    folder = tiny_model(kind)
    spec = ModelSpec.from_dir(folder)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, spec.vocab_size, (n,), generator=g).tolist() for n in (1, 9, 16, 33, 70)]
    kw = dict(device="cuda", dtype=torch.float32, num_blocks=64, block_size=16, max_num_seqs=8)
    eager = ModelRunner(spec, folder, enforce_eager=True, **kw)
    graphed = ModelRunner(spec, folder, max_model_len=512, **kw)
    assert eager.graphs is None and graphed.graphs is not None
    assert graphed.graphs.sizes == (1, 2, 4, 8)
    replays = []
    run = graphed.graphs.run
    graphed.graphs.run = lambda seqs: replays.append(len(seqs)) or run(seqs)  # type: ignore[method-assign]
    ours = generate(graphed, prompts, GREEDY)
    assert replays and set(replays) == {5}
    assert ours == generate(eager, prompts, GREEDY)
    # a batch of one (captured size) too
    assert generate(graphed, prompts[3:4], GREEDY) == generate(eager, prompts[3:4], GREEDY)


@pytest.mark.gpu
def test_graphed_verify_steps_equal_plain_decoding() -> None:
    """Speculative decoding on CUDA with captured verify graphs gives plain decoding's greedy
    tokens (fp32, tiny random model, repetitive prompts so drafts are accepted)."""
    from runtime.test_spec_serving import CFG, SPEC, serve

    from pdserve.runtime.runner import ModelRunner
    from pdserve.runtime.spec_step import SpeculativeRunner

    torch.backends.cuda.matmul.allow_tf32 = False
    runner = ModelRunner(SPEC, None, device="cuda", dtype=torch.float32, num_blocks=64, block_size=4,
                         load_format="dummy", seed=3, max_model_len=200, max_num_seqs=8)
    graphs = SpeculativeRunner(runner, CFG.num_speculative_tokens).graphs
    assert graphs is not None and graphs.sizes == (1, 2, 4, 8)
    replays = []
    run = graphs.run
    graphs.run = lambda seqs: replays.append(len(seqs)) or run(seqs)  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain, _ = serve(runner, False, 64, params)
    spec, sched = serve(runner, True, 64, params, graphs=graphs)
    assert spec == plain
    assert replays and sched.spec.stats.accepted > 0
