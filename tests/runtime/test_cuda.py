"""The CUDA path (Triton kernels through ModelRunner) against transformers on the same GPU."""

from __future__ import annotations

import pytest
import torch
from model.hf_tiny import ARCHS, hf_model, tiny_model  # noqa: F401 (fixture)

from pdserve.core.sampling import SamplingParams
from pdserve.model.spec import ModelSpec
from pdserve.runtime.offline import generate
from pdserve.runtime.runner import ModelRunner

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _prompts(vocab: int, lengths: tuple[int, ...]) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device="cuda")
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_cuda_fp32_greedy_matches_transformers(kind, tiny_model):
    torch.backends.cuda.matmul.allow_tf32 = False
    folder = tiny_model(kind)
    spec = ModelSpec.from_dir(folder)
    runner = ModelRunner(spec, folder, device="cuda", dtype=torch.float32, num_blocks=64, block_size=16)
    prompts = _prompts(spec.vocab_size, (1, 17, 40, 100))
    ours = generate(runner, prompts, GREEDY)
    model = hf_model(folder).to("cuda")
    assert ours == [_hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]


def _last_logits_bf16(kind, tiny_model):
    """(ours in bf16, transformers in bf16, transformers in fp32) logits of a 50-token prompt's
    last position."""
    folder = tiny_model(kind)
    spec = ModelSpec.from_dir(folder)
    runner = ModelRunner(spec, folder, device="cuda", dtype=torch.bfloat16, num_blocks=64, block_size=16)
    prompt = _prompts(spec.vocab_size, (50,))[0]
    from pdserve.core.step_io import SeqSlice, StepInput

    step = StepInput((SeqSlice("a", tuple(prompt), 0, tuple(range(4)), GREEDY),))
    ids, pos, meta = runner._prepare(step.seqs)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.inference_mode():
        ours = runner.model.compute_logits(runner.model.forward(ids, pos, meta, runner.kv_pool)).float()
        model = hf_model(folder).to(device="cuda")
        truth = model(torch.tensor([prompt], device="cuda")).logits[0, -1:].float()
        model = model.to(dtype=torch.bfloat16)
        ref = model(torch.tensor([prompt], device="cuda")).logits[0, -1:].float()
    return ours, ref, truth


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("kind", ["llama3_rope", "qwen2", "qwen3"])
def test_cuda_bf16_logits_close_to_transformers(kind, tiny_model):
    ours, ref, _ = _last_logits_bf16(kind, tiny_model)
    assert _rel(ours, ref) < 3e-2


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_cuda_bf16_moe_logits_as_close_as_transformers(kind, tiny_model):
    """A mixture of experts in bf16 adds roundings (and a near-tie of two experts can route a
    token elsewhere): our bf16 logits are held to transformers' own bf16 error, measured
    against the fp32 result, rather than to transformers' bf16 logits."""
    ours, ref, truth = _last_logits_bf16(kind, tiny_model)
    print(kind, "ours-vs-fp32", _rel(ours, truth), "hf-bf16-vs-fp32", _rel(ref, truth), "ours-vs-hf-bf16", _rel(ours, ref))
    assert _rel(ours, truth) < max(2e-2, 1.5 * _rel(ref, truth))


def _smollm2_dir():
    """The default model's folder: $PDSERVE_SMOLLM2_DIR, else the one `make run` prepared."""
    import os
    from pathlib import Path

    folder = Path(os.environ.get("PDSERVE_SMOLLM2_DIR")
                  or Path.home() / ".cache/pdserve/models/SmolLM2-135M-Instruct")
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"SmolLM2 weights not at {folder} (set PDSERVE_SMOLLM2_DIR)")
    return folder


def test_cuda_smollm2_greedy_matches_transformers():
    """The real default model, fp32 on the GPU: our greedy tokens equal transformers' on text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.backends.cuda.matmul.allow_tf32 = False
    folder = _smollm2_dir()
    spec = ModelSpec.from_dir(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    texts = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
             "List three colours: red,"]
    prompts = [tok(t)["input_ids"] for t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    runner = ModelRunner(spec, folder, device="cuda", dtype=torch.float32, num_blocks=64, block_size=16)
    ours = generate(runner, prompts, params)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to("cuda").eval()
    with torch.inference_mode():
        assert ours == [_hf_greedy(model, p, params.max_tokens) for p in prompts]
