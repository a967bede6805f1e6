"""Mixture-of-experts decode on one CUDA GPU: `python bench/moe.py --out FILE [--layers 16]`.

Qwen3-30B-A3B's shape (bench/configs/qwen3-30b-a3b.json: 128 experts, 8 per token) with random
weights, cut to --layers of its 48 so that transformers can run beside it on the same weights.
Keys: decode_bs1_tok_s and decode_bs1_active_roofline_ratio (the bytes a batch-1 step must read,
attention + router + the 8 chosen experts of every layer + lm_head, over the measured copy
rate), decode_tok_s_by_batch (1k context), prefill_tok_s_2048, the routed-experts op alone
(fused_moe: GB/s of the chosen experts at 1 token over the copy rate; TFLOP/s at 256 and 4096
tokens over the matmul rate; the plain-torch per-expert loop beside it), and
hf_generate_tok_s (transformers generate() on the same weights, batch 1 and 8).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
from engine import BS, CONFIGS, copy_bandwidth, decode_step, matmul_tflops, prefill_step, timed, weight_bytes

from pdserve.bench.provenance import source_commit
from pdserve.kernels import reference
from pdserve.kernels.fused_moe import moe_experts
from pdserve.model.loader import copy_into_hf
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner

CONFIG = "qwen3-30b-a3b"


def active_bytes(runner: ModelRunner) -> int:
    """Weight bytes a batch-1 decode step reads: all but the unchosen experts."""
    spec, w = runner.spec, runner.model.w
    experts = sum(w[f"layers.{l}.{n}"].nbytes for l in spec.moe_layers for n in ("experts_gate_up", "experts_down"))
    return weight_bytes(runner) - experts * (spec.num_experts - spec.num_experts_per_tok) // spec.num_experts


def op_figures(runner: ModelRunner, copy_gbps: float, mm_tflops: float) -> dict:
    """The routed experts of one layer alone: fused_moe against the per-expert torch loop."""
    spec = runner.spec
    lw = runner.model.layers[spec.moe_layers[0]]
    gate_up, down = lw["experts_gate_up"], lw["experts_down"]
    k, h, inter = spec.num_experts_per_tok, spec.hidden_size, spec.moe_intermediate_size
    out: dict = {}
    for t in (1, 256, 4096):
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        weights, ids = reference.moe_route(torch.randn(t, spec.num_experts, device="cuda"), k, True)
        fused = timed(lambda: moe_experts(x, weights, ids, gate_up, down), iters=20)
        loop = timed(lambda: reference.moe_experts(x, weights, ids, gate_up, down), iters=5)
        chosen = len(set(ids.flatten().tolist()))
        flops = 2 * t * k * 3 * h * inter
        row = {"fused_ms": fused * 1e3, "torch_loop_ms": loop * 1e3, "fused_over_loop_speedup": loop / fused,
               "experts_chosen": chosen, "fused_TFLOPs": flops / fused / 1e12,
               "fused_matmul_ratio": flops / fused / 1e12 / mm_tflops}
        if t == 1:
            nbytes = chosen * (gate_up[0].nbytes + down[0].nbytes)
            row |= {"fused_GBps": nbytes / fused / 1e9, "fused_copy_ratio": nbytes / fused / 1e9 / copy_gbps}
        out[str(t)] = row
    return out


def hf_generate(cfg: dict, runner: ModelRunner) -> dict:
    """transformers generate() on the same weights: 128-token prompts, 32 new tokens."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(
                AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"}), dtype=torch.bfloat16)
        model.eval()
        copy_into_hf(runner.spec, runner.model.w, model.state_dict())
        res: dict = {"experts_implementation": str(getattr(model.config, "_experts_implementation", "?"))}
        for b in (1, 8):
            ids = torch.randint(0, runner.spec.vocab_size, (b, 128), device="cuda")
            t = timed(lambda: model.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False),
                      iters=2, warmup=1)
            res[str(b)] = b * 32 / t
        del model
        return res
    except Exception as e:  # report, never hide: the figure is absent and the reason recorded
        return {"error": repr(e)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=16)
    a = p.parse_args()
    torch.manual_seed(0)
    cfg = json.loads((CONFIGS / f"{CONFIG}.json").read_text()) | {"num_hidden_layers": a.layers}
    spec = ModelSpec.from_config_dict(cfg)
    res: dict = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                 "commit": source_commit() or "unknown", "model": CONFIG, "layers": a.layers,
                 "copy_GBps": copy_bandwidth(), "matmul_TFLOPs": matmul_tflops()}
    runner = ModelRunner(spec, None, device="cuda", dtype=torch.bfloat16, num_blocks=128 * (1024 // BS + 2) + 64,
                         block_size=BS, load_format="dummy", max_model_len=4096, max_num_seqs=128)
    runner.kv_pool.normal_()
    active = active_bytes(runner) + runner.layout.token_bytes_per_layer * spec.num_layers * 129
    t = timed(lambda: runner.execute(decode_step(1, 128, spec.vocab_size)), iters=30)
    res |= {"active_bytes_bs1": active, "weight_bytes": weight_bytes(runner), "decode_bs1_tok_s": 1 / t,
            "decode_bs1_active_roofline_ratio": active / (res["copy_GBps"] * 1e9) / t}
    res["decode_tok_s_by_batch"] = {
        str(b): b / timed(lambda: runner.execute(decode_step(b, 1024, spec.vocab_size)), iters=10)
        for b in (1, 8, 32, 64, 128)}
    res["prefill_tok_s_2048"] = 2048 / timed(lambda: runner.execute(prefill_step(2048, spec.vocab_size)), iters=5)
    res["routed_experts_op"] = op_figures(runner, res["copy_GBps"], res["matmul_TFLOPs"])
    Path(a.out).write_text(json.dumps(res, indent=1))
    res["hf_generate_tok_s"] = hf_generate(cfg, runner)
    for b in ("1", "8"):
        if b in res["hf_generate_tok_s"]:
            res.setdefault("vs_hf_decode_ratio", {})[b] = res["decode_tok_s_by_batch"][b] / res["hf_generate_tok_s"][b]
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
