"""The layer draft (pdserve/bench/layer_draft.py): a target whose later layers are silenced and a
draft made of its first layers give the same greedy tokens, so every draft is accepted; noise
on the draft's head lowers that; speculation keeps the target's tokens either way."""

from __future__ import annotations

import pytest
from runtime.test_draft_model import GREEDY, TARGET, runner, serve

from pdserve.bench.layer_draft import layer_draft, silence_layers_from

THREE_LAYERS = {**TARGET, "num_hidden_layers": 3}


def _served(noise: float) -> tuple[dict[str, list[int]], dict[str, list[int]], float]:
    """(plain tokens, speculative tokens, acceptance rate) with a 1-layer draft of a 3-layer target."""
    target = runner(THREE_LAYERS, seed=5)
    silence_layers_from(target, 1)
    plain, _, _ = serve(target, None, 64, GREEDY)
    draft = layer_draft(target, 1, noise=noise, num_blocks=64)
    spec, sched, _ = serve(target, draft, 64, GREEDY)
    st = sched.spec.stats
    assert st.proposed > 0, st
    return plain, spec, st.accepted / st.proposed


def test_the_first_layers_draft_every_token_of_the_silenced_target() -> None:
    plain, spec, rate = _served(0.0)
    assert spec == plain and rate >= 0.95, rate


def test_head_noise_lowers_acceptance_and_keeps_the_tokens() -> None:
    plain, spec, rate = _served(2.0)
    assert spec == plain and rate < 0.8, rate


def test_silencing_changes_the_target() -> None:
    """Without silencing, the 1-layer draft is another model: fewer drafts accepted."""
    target = runner(THREE_LAYERS, seed=5)
    draft = layer_draft(target, 1, num_blocks=64)
    _, sched, _ = serve(target, draft, 64, GREEDY)
    st = sched.spec.stats
    assert st.accepted < 0.8 * st.proposed, st


@pytest.mark.parametrize("layers, noise, message", [(0, 0.0, "layers must be in"), (3, 0.0, "layers must be in"),
                                                    (1, -1.0, "noise must be >= 0")])
def test_bad_arguments_name_the_field(layers: int, noise: float, message: str) -> None:
    target = runner(THREE_LAYERS, seed=5)
    with pytest.raises(ValueError, match=message):
        silence_layers_from(target, layers)
        layer_draft(target, layers, noise=noise, num_blocks=8)


@pytest.mark.gpu
def test_graphed_draft_steps_draft_every_token_on_cuda() -> None:
    """On CUDA the draft's K steps replay its decode graphs queued back to back, each reading
    its token where the step before sampled it: with the layer draft every draft is right."""
    import torch

    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.runner import ModelRunner

    torch.backends.cuda.matmul.allow_tf32 = False
    target = ModelRunner(ModelSpec.from_config_dict(THREE_LAYERS), None, device="cuda", dtype=torch.float32,
                         num_blocks=64, block_size=4, load_format="dummy", seed=5, max_num_seqs=8)
    silence_layers_from(target, 1)
    plain, _, _ = serve(target, None, 64, GREEDY)
    draft = layer_draft(target, 1, num_blocks=64, max_num_seqs=8)
    assert draft.graphs is not None
    replays: list[int] = []
    run = draft.graphs.run
    draft.graphs.run = lambda seqs: replays.append(len(seqs)) or run(seqs)  # type: ignore[method-assign]
    spec, sched, _ = serve(target, draft, 64, GREEDY)
    st = sched.spec.stats
    assert spec == plain and replays and st.accepted >= 0.95 * st.proposed, (len(replays), st)
