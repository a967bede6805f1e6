"""Prefill and eager decode steps of any shape launch each kernel with one specialization.

Triton compiles a kernel once per combination of its arguments' specialization classes (an int
equal to 1 or divisible by 16, a pointer 16-byte aligned; not for do_not_specialize names), so
an argument whose class follows the batch makes steps compile new variants (~0.1-1 s each)
long after start-up (bench/jit_variants.py measures it on a GPU). This runs prefill batches of
varied sizes, some behind cached prefixes, each followed by an eager decode step, through a
ModelRunner on the Triton ops and records each launch's classes with Triton's rule.
"""

from __future__ import annotations

import random

import pytest
import torch

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.kernels import triton_ops
from pdserve.kernels._common import launchable_kernels
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner

SPEC = ModelSpec.from_config_dict(dict(
    model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=512,
))
# a mixture of experts: prefill steps take the expert tiles, decode steps the per-pair gemv
MOE_SPEC = ModelSpec.from_config_dict(dict(
    model_type="qwen3_moe", hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=128, max_position_embeddings=512, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=32,
))
BS = 4


def spec_class(value: object) -> object:
    """Triton's specialization of one launch argument (its type and the values it keys on)."""
    if isinstance(value, torch.Tensor):
        return ("ptr", value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or not isinstance(value, int):
        return type(value).__name__
    return ("int", value == 1, value % 16 == 0, -2**31 <= value < 2**31)


@pytest.mark.parametrize("spec", [SPEC, MOE_SPEC], ids=["dense", "moe"])
def test_steps_of_any_shape_share_one_variant_per_kernel(spec: ModelSpec) -> None:
    seen: dict[str, set] = {}
    found = list(launchable_kernels().values())
    assert any(k.__name__ == "_prefill_kernel" for k in found), [k.__name__ for k in found]
    for k in found:
        skip = k.do_not_specialize if hasattr(k, "do_not_specialize") else k.kwargs.get("do_not_specialize")
        names = k.arg_names
        skip = {names[i] if isinstance(i, int) else i for i in skip or ()}

        def record(*args: object, _k=k, _names=names, _skip=skip, **kwargs: object) -> None:
            classes = tuple(spec_class(a) for n, a in zip(_names, args) if n not in _skip)
            seen.setdefault(_k.__name__, set()).add(classes)

        k.add_pre_run_hook(record)
    try:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        runner = ModelRunner(spec, None, device=device, dtype=torch.float32, num_blocks=96, block_size=BS,
                             load_format="dummy", ops=triton_ops, enforce_eager=True)
        rng = random.Random(0)
        greedy = SamplingParams(temperature=0.0)
        for step in range(8):
            seqs, nxt = [], 0
            for i in range(1 + step % 4):
                n = rng.randint(5, 23)
                start = rng.randrange(0, n - 1, BS) if i % 2 else 0
                need = -(-n // BS)
                seqs.append(SeqSlice(f"r{i}", tuple(rng.randrange(128) for _ in range(n - start)), start,
                                     tuple(range(nxt, nxt + need + 1)), greedy))
                nxt += need + 1
            out = runner.execute(StepInput(tuple(seqs)))
            runner.execute(StepInput(tuple(  # then one eager decode step of the same sequences
                SeqSlice(s.request_id, (out.sampled[s.request_id],), s.end_pos, s.block_table, greedy)
                for s in seqs)))
    finally:
        for k in found:
            k.pre_run_hooks.clear()
    assert "_prefill_kernel" in seen and "_decode_kernel" in seen
    if spec.num_experts:
        assert "_moe_gemm_kernel" in seen and "_moe_gemv_kernel" in seen, sorted(seen)
    many = {name: len(v) for name, v in seen.items() if len(v) > 1}
    assert not many, f"kernels launched with several specializations: {many}"
