"""KV quantization and n-gram speculation on one GPU: `python bench/kvquant.py --out FILE`.

Keys: fp8_capacity_ratio (4k-context sequences an fp8 pool holds over bf16, same bytes),
fp8_decode_speedup_4k_bs256 (Llama-3.1-8B shape, dummy weights; eager decode steps; layers cut
to fit a bf16 pool of 256 x 4k tokens: per-layer cost is what changes),
fp8_decode_loop_speedup_4k_bs256 (the same shapes through the decode worker's engine loop: CUDA
graphs, CPU/GPU overlap; tokens/s), greedy_agreement_fp8
(SmolLM2-135M shape: real weights if $SMOLLM2_DIR names a model folder, else random),
ngram_speedup_bs1/bs32 (prompt-lookup workload: the model continues a text it was given
twice), ngram_slowdown_random (random prompts, temperature 1). Dummy weights make acceptance
rates unrepresentative of real text: the acceptance rate is reported beside each speedup.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import random
import statistics
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch

from pdserve.core.sampling import SamplingParams
from pdserve.core.speculative import SpecStats, SpeculativeConfig
from pdserve.bench.provenance import source_commit
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.model.spec import ModelSpec
from pdserve.runtime.kv_cache import block_bytes
from pdserve.runtime.kv_quant import quant_block_bytes
from pdserve.runtime.offline import generate
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_offline import generate_speculative
from pdserve.runtime.spec_step import SpeculativeRunner

CONFIGS = Path(__file__).parent / "configs"
BS, CTX = 16, 4096
SMOLLM2 = dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
               max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
               tie_word_embeddings=True)
NGRAM = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=1)


def sync() -> None:
    torch.cuda.synchronize()


def free(*objs: object) -> None:
    del objs
    gc.collect()
    torch.cuda.empty_cache()


def llama8b(layers: int | None = None) -> ModelSpec:
    d = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    if layers:
        d["num_hidden_layers"] = layers
    return ModelSpec.from_config_dict(d)


def capacity_ratio() -> dict:
    """Whole 4k sequences per byte budget: fp8 (values + per-token scales) over bf16."""
    spec = llama8b()
    budget = int(0.85 * torch.cuda.get_device_properties(0).total_memory) - (16 << 30)
    per_seq = CTX // BS
    bf16 = budget // block_bytes(spec, BS, torch.bfloat16) // per_seq
    fp8 = budget // quant_block_bytes(spec, BS) // per_seq
    return {"fp8_capacity_ratio": fp8 / bf16, "capacity_bf16_seqs": bf16, "capacity_fp8_seqs": fp8}


class DecodeStep:
    """One eager decode step of n sequences with CTX cached tokens over a `kv` pool, ready to time."""

    def __init__(self, kv: str, n: int, layers: int) -> None:
        spec = llama8b(layers)
        per = CTX // BS + 1
        self.runner = ModelRunner(spec, None, device="cuda", dtype=torch.bfloat16, num_blocks=n * per + 8,
                                  block_size=BS, load_format="dummy", max_model_len=CTX + 64,
                                  enforce_eager=True, kv_cache_dtype=kv)
        if kv == "auto":
            self.runner.kv_pool.normal_()
        else:  # random values, positive scales
            self.runner.kv_pool.view(torch.uint8).random_(0, 120)
        greedy = SamplingParams(temperature=0.0)
        self.step = StepInput(tuple(SeqSlice(f"s{i}", (i,), CTX, tuple(range(i * per, (i + 1) * per)), greedy)
                                    for i in range(n)))
        for _ in range(3):
            self.runner.execute(self.step)
        sync()

    def seconds(self) -> float:
        t0 = time.perf_counter()
        self.runner.execute(self.step)
        sync()
        return time.perf_counter() - t0

    def device_seconds(self) -> float:
        """The step on the device alone: CUDA events around it, queued behind a ~20 ms spin so
        that the host's preparation of the step (block tables of 256 x 4k tokens) falls outside."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(40_000_000)
        start.record()
        self.runner.execute(self.step)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3


def decode_speedup(layers: int = 16, n: int = 256, reps: int = 15) -> dict:
    """bf16 over fp8 decode step time, both pools alive and steps interleaved (a drift of the
    clocks between two separate runs moved the ratio from 1.09 to 1.54 on 2026-12-03); medians,
    and the spread of the per-pair ratios."""
    bf16, fp8 = DecodeStep("auto", n, layers), DecodeStep("fp8_e4m3", n, layers)
    pairs = [(bf16.seconds(), fp8.seconds()) for _ in range(reps)]
    on_device = [(bf16.device_seconds(), fp8.device_seconds()) for _ in range(reps)]
    del bf16, fp8
    free()
    b, f = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    bd, fd = statistics.median(p[0] for p in on_device), statistics.median(p[1] for p in on_device)
    ratios = sorted(p[0] / p[1] for p in pairs)
    return {"fp8_decode_speedup_4k_bs256": b / f, "decode_step_s_bf16": b, "decode_step_s_fp8": f,
            "fp8_decode_speedup_pair_range": [ratios[0], ratios[-1]], "decode_layers_used": layers,
            "decode_pairs": reps, "fp8_decode_speedup_device_time": bd / fd,
            "decode_step_device_s_bf16": bd, "decode_step_device_s_fp8": fd}


def _loop_runs(layers: int, n: int, reps: int, variants: dict[str, tuple[str, Callable]]) -> dict[str, list[float]]:
    """Decode tokens/s through the engine loop (bench/engine.py's loop_decode: scheduler, CUDA
    graphs, CPU/GPU overlap) on n sequences of CTX cached tokens, per variant (name: KV cache
    dtype and a context manager held while its runner is built and run), every runner alive and
    runs alternating."""
    from engine import LOOP_STEPS, loop_decode  # bench/engine.py

    spec = llama8b(layers)
    per = (CTX + LOOP_STEPS) // BS + 2
    runners = {}
    for name, (kv, ctx) in variants.items():
        with ctx():
            runners[name] = ModelRunner(spec, None, device="cuda", dtype=torch.bfloat16, num_blocks=n * per + 8,
                                        block_size=BS, load_format="dummy",
                                        max_model_len=CTX + LOOP_STEPS + 2 * BS, kv_cache_dtype=kv)
            if kv == "auto":
                runners[name].kv_pool.normal_()
            else:
                runners[name].kv_pool.view(torch.uint8).random_(0, 120)
    runs: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(reps):
        for name, runner in runners.items():
            with variants[name][1]():
                runs[name].append(loop_decode(runner, spec, n, CTX, True))
    del runners
    free()
    return runs


def decode_loop_speedup(layers: int = 16, n: int = 256, reps: int = 3, slot_major: bool = False,
                        int8: bool = False) -> dict:
    """fp8 over bf16 decode tokens/s of the decode worker's engine loop (_loop_runs); medians.
    The eager step of decode_speedup also times the host building 256 block tables of 4k tokens,
    which the loop overlaps with the GPU. slot_major: also fp8 with the block layout before
    2026-12-06 (slot_major_fp8_blocks); int8: also an int8 cache."""
    variants = {"auto": ("auto", contextlib.nullcontext), "fp8_e4m3": ("fp8_e4m3", contextlib.nullcontext)}
    if slot_major:
        variants["fp8_e4m3_slot_major"] = ("fp8_e4m3", slot_major_fp8_blocks)
    if int8:
        variants["int8"] = ("int8", contextlib.nullcontext)
    runs = _loop_runs(layers, n, reps, variants)
    med = {name: statistics.median(r) for name, r in runs.items()}
    b, f = med["auto"], med["fp8_e4m3"]
    res = {"layers": layers, "fp8_decode_loop_speedup_4k_bs256": f / b, "decode_loop_tok_s_bf16": b,
           "decode_loop_tok_s_fp8": f, "decode_loop_runs": runs}
    if slot_major:
        res["fp8_slot_major_decode_loop_speedup_4k_bs256"] = med["fp8_e4m3_slot_major"] / b
    if int8:
        res["int8_decode_loop_speedup_4k_bs256"] = med["int8"] / b
    return res


@contextlib.contextmanager
def slot_major_fp8_blocks():
    """While open, quantized pools' value views are slot-major ([S, Hk, D] per block: the
    layout before 2026-12-06) instead of head-major; graphs captured inside keep it."""
    from pdserve.runtime import kv_quant

    def split(cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        values, scales = head_major(cache, head_dim)
        hk = values.shape[2]
        return values.as_strided(values.shape, (values.stride(0), hk * head_dim, head_dim, 1)), scales

    head_major = kv_quant._split_block
    kv_quant._split_block = split
    try:
        yield
    finally:
        kv_quant._split_block = head_major


def decode_loop_layout_ab(layers: int = 12, n: int = 256, reps: int = 3) -> dict:
    """fp8 decode tokens/s through the engine loop with head-major value blocks against
    slot-major ones (_loop_runs); medians."""
    runs = _loop_runs(layers, n, reps, {"head_major": ("fp8_e4m3", contextlib.nullcontext),
                                        "slot_major": ("fp8_e4m3", slot_major_fp8_blocks)})
    h, s = statistics.median(runs["head_major"]), statistics.median(runs["slot_major"])
    return {"layers": layers, "fp8_head_major_over_slot_major": h / s, "decode_loop_tok_s_head_major": h,
            "decode_loop_tok_s_slot_major": s, "decode_loop_runs": runs}


def k_upcast_ops() -> types.SimpleNamespace:
    """The CUDA ops with the fp8 decode kernel of before 2026-12-04 (K upcast by PTX bit moves):
    the greedy-agreement baseline of the default kernel."""
    from pdserve.kernels import triton_ops

    ops = types.SimpleNamespace(**{name: getattr(triton_ops, name) for name in triton_ops.__all__})
    ops.paged_decode_attention = functools.partial(triton_ops.paged_decode_attention, k_convert=False)
    return ops


def greedy_agreement(device: str = "cuda") -> dict:
    """Share of greedy tokens (position by position) of a quantized pool equal to the bf16 run,
    and the mean position of a sequence's first differing token (64: none differ), for fp8,
    int8 and (CUDA) the fp8 kernel that upcasts K (k_upcast). The noise floor beside them: the
    same model in float32 against bf16 (greedy paths part wherever two logits nearly tie, so
    even exact arithmetic in another precision diverges). Random-token prompts; with
    $SMOLLM2_DIR also text prompts (text_lookup_prompts), keys suffixed _text."""
    model_dir = os.environ.get("SMOLLM2_DIR")
    spec = ModelSpec.from_dir(Path(model_dir)) if model_dir else ModelSpec.from_config_dict(SMOLLM2)
    rng = random.Random(0)
    prompt_sets = {"": [[rng.randrange(spec.vocab_size) for _ in range(64)] for _ in range(16)]}
    if model_dir:
        prompt_sets["_text"] = text_lookup_prompts(model_dir, 16)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    variants = [("bf16", torch.bfloat16, "auto", None), ("fp32", torch.float32, "auto", None),
                ("fp8", torch.bfloat16, "fp8_e4m3", None), ("int8", torch.bfloat16, "int8", None)]
    if device == "cuda":
        variants.append(("fp8_k_upcast", torch.bfloat16, "fp8_e4m3", k_upcast_ops()))
    res: dict = {"agreement_weights": "real" if model_dir else "dummy", "agreement_device": device}
    for suffix, prompts in prompt_sets.items():
        outs = {}
        for name, dtype, kv, ops in variants:
            runner = ModelRunner(spec, model_dir, device=device, dtype=dtype, num_blocks=512,
                                 block_size=BS, load_format="auto" if model_dir else "dummy",
                                 enforce_eager=True, kv_cache_dtype=kv, ops=ops)
            outs[name] = generate(runner, prompts, params)
            free(runner)
        for name, *_ in variants[1:]:
            key = "fp32_floor" if name == "fp32" else name
            pairs = list(zip(outs["bf16"], outs[name]))
            same = sum(a == b for x, y in pairs for a, b in zip(x, y))
            first = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in pairs]
            res[f"greedy_agreement_{key}{suffix}"] = same / sum(len(x) for x in outs["bf16"])
            res[f"greedy_first_difference_mean_{key}{suffix}"] = statistics.mean(first)
    return res


def lookup_prompts(n: int, vocab: int, length: int = 256) -> list[list[int]]:
    """'Edit this text' prompts: a random text, a separator, then the same text again."""
    rng = random.Random(1)
    out = []
    for _ in range(n):
        text = [rng.randrange(vocab) for _ in range(length)]
        out.append(text + [1, 2, 3] + text[: length // 4])
    return out


def timed_generate(runner: ModelRunner, prompts, params, cfg, verifier=None) -> tuple[float, SpecStats]:
    stats = SpecStats()
    sync()
    t0 = time.perf_counter()
    # the same loop with and without drafts (cfg None): only speculation differs
    generate_speculative(runner, prompts, params, cfg, stats=stats, verifier=verifier)
    sync()
    return time.perf_counter() - t0, stats


def ngram(runner: ModelRunner, prompts, params, verifier, reps: int = 9) -> tuple[float, float, int]:
    """(plain seconds / speculative seconds, acceptance rate, verify steps that carried drafts):
    medians of `reps` alternating runs
    after one warm-up of each mode on the same prompts (a first run at a new batch size compiles
    kernels and captures graphs: timed, it made the baseline look slow)."""
    timed_generate(runner, prompts, params, None, verifier)
    timed_generate(runner, prompts, params, NGRAM, verifier)
    plain, spec, acc, steps = [], [], [], []
    for _ in range(reps):
        plain.append(timed_generate(runner, prompts, params, None, verifier)[0])
        seconds, stats = timed_generate(runner, prompts, params, NGRAM, verifier)
        spec.append(seconds)
        acc.append(stats.acceptance_rate)
        steps.append(stats.steps)
    ratios = sorted(p / s for p, s in zip(plain, spec))
    print(f"ngram bs{len(prompts)}: plain/spec per pair {ratios[0]:.3f} .. {ratios[-1]:.3f}, quartiles "
          f"{ratios[len(ratios) // 4]:.3f} / {ratios[3 * len(ratios) // 4]:.3f}", flush=True)
    return statistics.median(plain) / statistics.median(spec), statistics.median(acc), int(statistics.median(steps))


def text_lookup_prompts(model_dir: str, n: int) -> list[list[int]]:
    """Prompt-lookup texts (copy a list, copy code with an edit, copy notes; spec_decode.py's),
    tokenized by the model's tokenizer, cycled to n prompts."""
    from gateway.tokenizer import load_tokenizer
    from spec_decode import PROMPTS

    tok = load_tokenizer(Path(model_dir))
    texts = [tok.encode(t) for t in PROMPTS]
    return [texts[i % len(texts)] for i in range(n)]


def ngram_results() -> dict:
    """n-gram speedups through the decode worker's verifier (graphs on CUDA). With $SMOLLM2_DIR:
    the real default model on text prompts; else Llama-3.1-8B's shape with random weights."""
    model_dir = os.environ.get("SMOLLM2_DIR")
    spec = ModelSpec.from_dir(Path(model_dir)) if model_dir else llama8b()
    runner = ModelRunner(spec, model_dir, device="cuda", dtype=torch.bfloat16, num_blocks=32 * 40 + 64,
                         block_size=BS, load_format="auto" if model_dir else "dummy", max_model_len=1024,
                         max_num_seqs=32)
    verifier = SpeculativeRunner(runner, NGRAM.num_speculative_tokens)
    greedy = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    out = {"ngram_weights": "SmolLM2-135M-Instruct (real)" if model_dir else "llama-3.1-8b shape (dummy)",
           "ngram_verify_graphs": verifier.graphs is not None}
    for bs in (1, 32):
        prompts = text_lookup_prompts(model_dir, bs) if model_dir else lookup_prompts(bs, spec.vocab_size)
        speed, acc, steps = ngram(runner, prompts, greedy, verifier)
        out[f"ngram_speedup_bs{bs}"], out[f"ngram_acceptance_bs{bs}"] = speed, acc
        out[f"ngram_verify_steps_bs{bs}"] = steps
    rng = random.Random(2)
    rand = [[rng.randrange(spec.vocab_size) for _ in range(256)] for _ in range(8)]
    speed, acc, steps = ngram(runner, rand, SamplingParams(temperature=1.0, max_tokens=128, ignore_eos=True),
                              verifier, reps=31)  # ~0.3 s runs: 9 pairs left a +-6 % spread
    out["ngram_slowdown_random"], out["ngram_acceptance_random"] = 1.0 / speed - 1.0, acc
    out["ngram_verify_steps_random"] = steps  # of 128 decode steps
    out["ngram_random_reps"] = 31
    free(runner)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--agreement-only", action="store_true",
                    help="only greedy_agreement (runs on CPU too: the torch reference path)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.agreement_only:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        res = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
               "date": time.strftime("%Y-%m-%d"), "commit": source_commit()} | greedy_agreement(device)
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))
        return
    res: dict = {"gpu": torch.cuda.get_device_name(0)}
    for part in (capacity_ratio, decode_speedup, decode_loop_speedup, greedy_agreement, ngram_results):
        res |= part()
        print(json.dumps(res), flush=True)
    res["bench_seconds"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
