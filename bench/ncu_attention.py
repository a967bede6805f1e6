"""Launch the paged decode attention kernel over bf16 and fp8 pools at 256 x 4k context
(Llama-3.1-8B heads), a few times each, for Nsight Compute (diagnostic, CUDA only):

    ncu --kernel-name regex:_decode_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats python bench/ncu_attention.py fp8

Argument: bf16 or fp8. Values are random; nothing is checked or timed here.
"""

from __future__ import annotations

import sys

import torch

from pdserve.kernels.decode_attention import decode_with_partitions
from pdserve.model.spec import ModelSpec
from pdserve.runtime.kv_quant import allocate_quant_pool, layer_views

HQ, HK, D, S, SEQS, CTX = 32, 8, 128, 16, 256, 4096


def main(kind: str) -> None:
    need = CTX // S
    tables = torch.randperm(SEQS * need, device="cuda", dtype=torch.int32).view(SEQS, need)
    lens = torch.full((SEQS,), CTX, dtype=torch.int32, device="cuda")
    q = torch.randn(SEQS, HQ, D, device="cuda", dtype=torch.bfloat16)
    if kind == "fp8":
        spec = ModelSpec.from_config_dict({
            "model_type": "llama", "hidden_size": HQ * D, "intermediate_size": 256, "num_hidden_layers": 1,
            "num_attention_heads": HQ, "num_key_value_heads": HK, "vocab_size": 256})
        pool = allocate_quant_pool(spec, SEQS * need, S, "fp8_e4m3", "cuda")
        v = layer_views(pool, 0, D)
        for t in (v.k, v.v):
            t.view(torch.uint8).copy_((torch.randn(t.shape, device="cuda") * 0.5).to(torch.float8_e4m3fn).view(torch.uint8))
        v.k_scale.fill_(0.01)
        v.v_scale.fill_(0.01)
        args = (v.k, v.v, tables, lens, D ** -0.5, CTX, v.k_scale, v.v_scale)
    else:
        pool = torch.randn(2, SEQS * need, S, HK, D, device="cuda", dtype=torch.bfloat16)
        args = (pool[0], pool[1], tables, lens, D ** -0.5, CTX)
    for _ in range(4):
        decode_with_partitions(q, *args)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp8")
