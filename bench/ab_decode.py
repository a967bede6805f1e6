"""A/B of batch-1 decode variants in one process (diagnostic, CUDA only).

    python bench/ab_decode.py --out FILE [--model llama-3.1-8b] [--batch 1] [--ctx 128] [--rounds 4]

One runner (random weights of the model's shape, the table width of a 4k model length as in
bench/engine.py); each variant patches the op namespace, captures the decode graphs again and
times `--iters` steps; variants take turns over `--rounds` rounds, so drift of the machine hits
them alike. Variants: the RMSNorm fused into the gemv after it and the rotary embedding fused
with the KV write (rotary_write_kv), or separate kernels; the SiLU-and-mul inside the gate_up
gemv (norm_glu) or its own kernel; the rotary embedding and KV write inside the decode
attention kernel (decode_rotary_attention, since 2026-12-05) or before it; cuBLASLt for torch's
GEMMs or cuBLAS; the pool's storage read with head-major blocks (head_major: no gain for bf16,
bench/results/ab-decode-layout-h100-2026-12-06-s17-*.json). (The qkv gemv warming 8/16/32 MiB of
the o weight into L2 instead of 4, through the attention between them: even or slower,
bench/results/ab-decode-pf-attn-h100-2026-12-07-s23b-*.json from 802aa16.) (The "no_glu" variant,
SiLU-and-mul apart from the gemv, was measured in
bench/results/ab-decode-glu-h200-2026-12-04-s9.json.) (The L2 warm-up at 4/8/16 MiB against none:
bench/results/ab-decode-l2-prefetch-h200-2026-12-04-s9.json, from next/l2-prefetch d1c5806.)
(bench/results/ab-decode-h200-2026-12-03-s8.json came from commit 98a4f89, whose variants also
fused the SiLU-and-mul into the down projection and launched the gemv with programmatic
dependent launch; -s8d.json from 97f26f8, where the PDL gemv also read its first weight tile
before waiting for the kernel ahead: neither helped, and both were removed.)
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

import pdserve.kernels.decode_attention as decode_attention
import pdserve.kernels.gemv as gemv
import pdserve.kernels.triton_ops as ops
from pdserve.kernels.decode_attention import paged_decode_attention
from pdserve.kernels.decode_rotary_attention import decode_rotary_attention
from pdserve.kernels.rms_norm import rms_norm
from pdserve.kernels.rotary import rotary
from pdserve.kernels.rotary_write_kv import rotary_write_kv
from pdserve.kernels.silu_and_mul import silu_and_mul
from pdserve.kernels.write_kv import write_kv
from pdserve.model.spec import ModelSpec
from pdserve.runtime.cuda_graph import DecodeGraphs
from pdserve.runtime.runner import ModelRunner

from engine import BS, CONFIGS, decode_step, timed  # bench/ is on sys.path when run as a script


def unfused_norm_linear(x, norm_weight, eps, residual, weight, bias=None, prefetch=None):
    normed, summed = rms_norm(x, norm_weight, eps, residual)
    return gemv.linear(normed, weight, bias, prefetch=prefetch), summed


def unfused_rotary_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, *scales):
    q, k = rotary(q, k, positions, cos_sin)
    write_kv(k, v, k_cache, v_cache, slot_mapping, *scales)
    return q


def unfused_norm_glu(x, norm_weight, eps, residual, weight, bias=None, prefetch=None):
    out, summed = ops.norm_linear(x, norm_weight, eps, residual, weight, bias, prefetch=prefetch)
    return silu_and_mul(out), summed


def unfused_decode_rotary_attention(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping,
                                    block_tables, seq_lens, scale, *scales):
    q = ops.rotary_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, *scales)
    return paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, *scales)


@dataclass(frozen=True)
class Variant:
    norm: bool = True  # RMSNorm inside the gemv after it
    rotary: bool = True  # rotary + KV write in one kernel (rotary_write_kv)
    prefetch: int = 4 << 20  # bytes of the next weight warmed into L2
    glu: bool = True  # SiLU-and-mul inside the gate_up gemv
    rope_decode: bool = True  # rotary + KV write inside the decode attention kernel
    blas: str = "cublas"  # torch's GEMM library (batches past the gemv's reach)
    split_per_sm: int = 2  # decode attention splits sequences until this many programs per SM
    table_tokens: int = 0  # the graphs' block-table width in tokens (0: the runner's model length)
    head_major: bool = False  # cache blocks read as [Hk, S, D] (a head's page contiguous), not [S, Hk, D]


VARIANTS = {
    "fused": Variant(),
    "rope_apart": Variant(rope_decode=False),  # the default before 2026-12-05
    "cublaslt": Variant(blas="cublaslt"),
    "separate": Variant(False, False, 0, False, False),
    "split8": Variant(split_per_sm=8),  # the split heuristic before 2026-12-05
    "table256": Variant(table_tokens=256),  # graphs for short contexts: one attention partition
    "table1k": Variant(table_tokens=1024),
    "head_major": Variant(head_major=True),
}


def head_major_view(pool: torch.Tensor) -> torch.Tensor:
    """The pool's storage read with head-major blocks: [L, 2, N, S, Hk, D] over [L, 2, N, Hk, S, D]
    (the same bytes, so the same random contents, in another order: timing only)."""
    s, hk, d = pool.shape[3:]
    strides = pool.stride()[:3] + (d, s * d, 1)
    return pool.as_strided(pool.shape, strides, pool.storage_offset())


def apply(v: Variant) -> None:
    ops.norm_linear = gemv.norm_linear if v.norm else unfused_norm_linear
    ops.norm_glu = gemv.norm_glu if v.glu else unfused_norm_glu
    ops.rotary_write_kv = rotary_write_kv if v.rotary else unfused_rotary_write_kv
    ops.decode_rotary_attention = decode_rotary_attention if v.rope_decode else unfused_decode_rotary_attention
    gemv.PREFETCH_BYTES = v.prefetch
    torch.backends.cuda.preferred_blas_library(v.blas)
    decode_attention._PROGRAMS_PER_SM = v.split_per_sm


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--batch", type=int, default=1, help="sequences per step (the default: batch-1 decode)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    a = p.parse_args()
    if unknown := set(a.variants.split(",")) - set(VARIANTS):
        p.error(f"--variants: unknown {sorted(unknown)}; choose from {','.join(VARIANTS)}")
    variants = {name: VARIANTS[name] for name in a.variants.split(",")}
    spec = ModelSpec.from_config_dict(json.loads((CONFIGS / f"{a.model}.json").read_text()))
    max_len = 4096 + 64
    blocks = max(max_len // BS, a.batch * (a.ctx // BS + 1)) + 64
    runner = ModelRunner(spec, None, device="cuda", dtype=torch.bfloat16, num_blocks=blocks,
                         block_size=BS, load_format="dummy", max_model_len=max_len, max_num_seqs=a.batch)
    runner.kv_pool.normal_()
    pools = {False: runner.kv_pool, True: head_major_view(runner.kv_pool)}
    step = decode_step(a.batch, a.ctx, spec.vocab_size)
    times: dict[str, list[float]] = {name: [] for name in variants}
    tokens: dict[str, int] = {}
    for _ in range(a.rounds):
        for name, variant in variants.items():
            apply(variant)
            runner.kv_pool = pools[variant.head_major]
            runner.graphs = DecodeGraphs(runner.model, runner.kv_pool, block_size=BS,
                                         max_model_len=variant.table_tokens or runner.max_model_len,
                                         max_num_seqs=a.batch)
            tokens[name] = runner.execute(step).sampled["s0"]
            times[name].append(timed(lambda: runner.execute(step), iters=a.iters))
    res = {"gpu": torch.cuda.get_device_name(), "model": a.model, "batch": a.batch, "ctx": a.ctx, "variants": {}}
    for name, ts in times.items():
        ms = statistics.median(ts) * 1e3
        res["variants"][name] = {"step_ms": ms, "tok_s": a.batch * 1e3 / ms, "rounds_ms": [t * 1e3 for t in ts]}
        print(f"{name:14s} step {ms:.3f} ms  {a.batch * 1e3 / ms:8.1f} tok/s  rounds "
              + " ".join(f"{t * 1e3:.3f}" for t in ts), flush=True)
    print("first tokens", tokens)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
