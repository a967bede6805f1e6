"""Engine benchmark on one CUDA GPU: decode, prefill, paged attention, vs transformers and rooflines.

python bench/engine.py --out bench/results/engine-<gpu>-<date>.json [--models llama-3.1-8b,qwen2.5-7b]
Random weights of real shapes (--load-format dummy); speed does not depend on the values.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pdserve.bench.provenance import source_commit
from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Sequence, SeqStatus
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.model.spec import ModelSpec
from pdserve.runtime.loop import EngineLoop
from pdserve.runtime.runner import ModelRunner

from kernel_bench import bench_decode  # bench/ is on sys.path when run as a script
from tracing_cost import tracing_cost

CONFIGS = Path(__file__).parent / "configs"
GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20)
BS = 16


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, iters: int = 10, warmup: int = 2) -> float:
    """Median seconds of fn() with the device synchronised around each call."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth() -> float:
    a = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    b = torch.empty_like(a)
    t = timed(lambda: b.copy_(a), iters=20)
    return 2 * a.numel() * a.element_size() / t / 1e9


def matmul_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: a @ b, iters=20)
    return 2 * 8192**3 / t / 1e12


def decode_step(n_seqs: int, ctx: int, vocab: int) -> StepInput:
    """n_seqs sequences with ctx cached tokens each, in disjoint blocks, decoding one token."""
    per = ctx // BS + 1
    return StepInput(tuple(
        SeqSlice(f"s{i}", (i % vocab,), ctx, tuple(range(i * per, (i + 1) * per)), GREEDY)
        for i in range(n_seqs)))


def prefill_step(n_tokens: int, vocab: int, prompt_logprobs: int | None = None) -> StepInput:
    """One n-token prompt, prefilled whole (with its prompt logprobs if asked)."""
    ids = tuple(torch.randint(0, vocab, (n_tokens,)).tolist())
    params = GREEDY if prompt_logprobs is None else dataclasses.replace(GREEDY, prompt_logprobs=prompt_logprobs)
    return StepInput((SeqSlice("p", ids, 0, tuple(range(n_tokens // BS + 1)), params,
                               prompt_targets=ids[1:] if prompt_logprobs is not None else ()),))


def weight_bytes(runner: ModelRunner) -> int:
    """Bytes a decode step must read: every weight once; of the embedding only its rows, so it
    counts only when tied to lm_head (which reads it whole)."""
    seen, total = set(), 0
    for name, t in runner.model.w.items():
        if name == "embed" and not runner.spec.tie_word_embeddings:
            continue
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


SECTIONS = ("decode", "loop", "prefill", "hf", "overhead", "tracing")  # the default run
OPTIONAL = ("extras", "guided")  # on request: --sections extras,guided
LOOP_STEPS = 64


def bench_model(name: str, copy_gbps: float, mm_tflops: float, sections: tuple[str, ...] = SECTIONS,
                device: str = "cuda") -> dict:
    spec = ModelSpec.from_config_dict(json.loads((CONFIGS / f"{name}.json").read_text()))
    num_blocks = 256 * (1024 // BS + 1 + LOOP_STEPS // BS + 1) + 64
    runner = ModelRunner(spec, None, device=device, dtype=torch.bfloat16, num_blocks=num_blocks,
                         block_size=BS, load_format="dummy", max_model_len=8192 + 512, max_num_seqs=256)
    runner.kv_pool.normal_()  # never time on zeros
    wbytes = weight_bytes(runner)
    kv_tok = runner.layout.token_bytes_per_layer * spec.num_layers
    out: dict = {"weight_bytes": wbytes}
    run = lambda step: (lambda: runner.execute(step))  # noqa: E731
    if "decode" in sections:
        out.update(decode_figures(runner, spec, wbytes, kv_tok, copy_gbps))
    if "loop" in sections:
        out.update(loop_figures(runner, spec, wbytes, kv_tok, copy_gbps))
    if "overhead" in sections:
        t = timed(run(decode_step(256, 1024, spec.vocab_size)), iters=10)
        out["step_cpu_overhead_ratio_bs256"] = cpu_overhead(runner, spec, t)
    if "extras" in sections:
        out.update(extras_loop_figures(runner, spec))
    if "guided" in sections:
        out.update(guided_loop_figures(runner, spec))
    if "tracing" in sections:
        out["tracing_bs32"] = tracing_cost(runner, batch=32, ctx=1024, steps=40)
    if "prefill" in sections:
        out.update(prefill_figures(runner, spec, wbytes, mm_tflops))
    if "hf" in sections:
        out["hf_generate_tok_s"] = hf_generate(spec, runner)
        if "decode_tok_s_by_batch" in out:
            out["vs_hf_decode_ratio"] = {b: out["decode_tok_s_by_batch"][b] / out["hf_generate_tok_s"][b]
                                         for b in ("1", "32") if out["hf_generate_tok_s"].get(b)}
    del runner
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def decode_figures(runner: ModelRunner, spec: ModelSpec, wbytes: int, kv_tok: int, copy_gbps: float) -> dict:
    """Batch-1 decode at 128 and 4k context (and its roofline ratio), decode tok/s by batch at 1k."""
    out: dict = {}
    run = lambda step: (lambda: runner.execute(step))  # noqa: E731
    bs1 = {}
    for ctx in (128, 4096):
        t = timed(run(decode_step(1, ctx, spec.vocab_size)), iters=30)
        bs1[str(ctx)] = {"tok_s": 1 / t, "roofline_ratio": (wbytes + kv_tok * ctx) / (copy_gbps * 1e9) / t}
    out["decode_bs1_by_ctx"] = bs1
    if runner.graphs is not None:  # GPU time alone: replay the bs-1 graph with no host work
        runner.execute(decode_step(1, 128, spec.vocab_size))
        t = timed(runner.graphs._graphs[1].replay, iters=30)
        out["decode_bs1_replay_only"] = {"tok_s": 1 / t, "roofline_ratio": (wbytes + kv_tok * 129) / (copy_gbps * 1e9) / t}
    out["decode_bs1_tok_s"] = bs1["128"]["tok_s"]
    out["decode_bs1_roofline_ratio"] = bs1["128"]["roofline_ratio"]
    by_batch = {}
    for b in (1, 8, 32, 64, 128, 256):
        t = timed(run(decode_step(b, 1024, spec.vocab_size)), iters=10)
        by_batch[str(b)] = b / t
    out["decode_tok_s_by_batch"] = by_batch
    return out


def loop_decode(runner: ModelRunner, spec: ModelSpec, batch: int, ctx: int, overlap: bool,
                temperature: float = 0.0, top_p: float = 1.0, guide: Callable[[], object] | None = None,
                **extra) -> float:
    """Decode tok/s of the whole engine loop (scheduler, staging, sampling, token events) on
    `batch` running sequences of `ctx` cached tokens: batch over the median gap between one
    request's tokens, LOOP_STEPS steps, the first 8 left out. Greedy unless temperature > 0;
    `extra`: more SamplingParams fields (logprobs, penalties); `guide()`: each sequence's guide."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=256, max_model_len=ctx + LOOP_STEPS + BS,
                                      enable_prefix_caching=False), BlockManager(runner.num_blocks, BS))
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=LOOP_STEPS, ignore_eos=True, **extra)
    stamps: list[float] = []
    ended = []
    loop = EngineLoop(sched, runner, overlap=overlap)

    def sink(ev) -> None:
        if ev.request_id == "s0":
            stamps.append(time.perf_counter())
        if ev.finish is not None:
            ended.append(ev.request_id)

    for i in range(batch):  # running already, as a decode worker admits transferred requests
        prompt = [(i * 7919 + j) % spec.vocab_size for j in range(ctx)]
        loop.submit(Sequence(f"s{i}", prompt, params, output_ids=[7], block_table=sched.blocks.allocate(ctx // BS + 1),
                             num_computed=ctx, status=SeqStatus.RUNNING, guide=guide() if guide else None), sink)
    loop.start()
    deadline = time.time() + 120
    while len(ended) < batch and time.time() < deadline:
        time.sleep(0.01)
    loop.stop()
    assert len(ended) == batch and sched.blocks.num_free == sched.blocks.num_total, "loop run did not finish"
    gaps = [b - a for a, b in zip(stamps[8:], stamps[9:])]
    return batch / statistics.median(gaps)


def loop_figures(runner: ModelRunner, spec: ModelSpec, wbytes: int, kv_tok: int, copy_gbps: float) -> dict:
    """Engine-loop decode at 1k context by batch, CPU/GPU overlap on; off at batch 1 and 256."""
    on = {str(b): loop_decode(runner, spec, b, 1024, True) for b in (1, 8, 32, 64, 128, 256)}
    off = {str(b): loop_decode(runner, spec, b, 1024, False) for b in (1, 256)}
    on128 = loop_decode(runner, spec, 1, 128, True)
    step_bytes = wbytes + kv_tok * (129 + LOOP_STEPS // 2)  # the context grows over the run
    return {"decode_loop_tok_s_by_batch": on, "decode_loop_plain_tok_s_by_batch": off,
            **sampled_loop_figures(runner, spec),
            "decode_loop_bs1_ctx128": {"tok_s": on128, "roofline_ratio": step_bytes / (copy_gbps * 1e9) * on128}}


def sampled_loop_figures(runner: ModelRunner, spec: ModelSpec) -> dict:
    """Engine-loop decode at 1k context with every row drawn at temperature 1, at batch 1 and
    256: with top-p 0.9 ("sampled", overlap on and off) and with temperature alone
    ("temperature", overlap on); each also overlapped with the Triton draws off
    (sampler.KERNEL_SAMPLING: sorting or nucleus_threshold, then the exponential race)."""
    from pdserve.runtime import sampler

    def by_batch(overlap: bool, top_p: float) -> dict:
        return {str(b): loop_decode(runner, spec, b, 1024, overlap, temperature=1.0, top_p=top_p) for b in (1, 256)}

    res = {"decode_loop_sampled_overlap_tok_s_by_batch": by_batch(True, 0.9),
           "decode_loop_sampled_plain_tok_s_by_batch": by_batch(False, 0.9),
           "decode_loop_temperature_overlap_tok_s_by_batch": by_batch(True, 1.0)}
    sampler.KERNEL_SAMPLING = False
    try:
        res["decode_loop_sampled_overlap_no_kernel_tok_s_by_batch"] = by_batch(True, 0.9)
        res["decode_loop_temperature_overlap_no_kernel_tok_s_by_batch"] = by_batch(True, 1.0)
    finally:
        sampler.KERNEL_SAMPLING = True
    return res


def extras_loop_figures(runner: ModelRunner, spec: ModelSpec) -> dict:
    """What logprobs and penalties cost: engine-loop greedy decode at 1k context, batch 1 and
    256, overlap on, plain beside every row asking 5 logprobs, and every row penalized
    (frequency 0.5, repetition 1.1: counts on the device, each history read on the first step),
    with the Triton penalties kernel and with its torch twin (penalties.KERNEL_PENALTIES off);
    and a 2k-token prefill (one step, result read) plain and asking 5 prompt logprobs."""
    from pdserve.runtime import penalties

    def by_batch(**extra) -> dict:
        return {str(b): loop_decode(runner, spec, b, 1024, True, **extra) for b in (1, 256)}

    pen = dict(frequency_penalty=0.5, repetition_penalty=1.1)
    res = {"decode_loop_greedy_tok_s_by_batch": by_batch(),
           "decode_loop_logprobs5_tok_s_by_batch": by_batch(logprobs=5),
           "decode_loop_penalized_tok_s_by_batch": by_batch(**pen)}
    penalties.KERNEL_PENALTIES = False
    try:
        res["decode_loop_penalized_torch_tok_s_by_batch"] = by_batch(**pen)
    finally:
        penalties.KERNEL_PENALTIES = True
    run = lambda step: (lambda: runner.execute(step))  # noqa: E731
    res["prefill_2048_ms"] = {name: timed(run(prefill_step(2048, spec.vocab_size, k)), iters=5) * 1000
                              for name, k in (("plain", None), ("prompt_logprobs5", 5))}
    return res


class RotatingMasks:
    """A guide for timing the device side of structured output without a tokenizer: it hands out
    4 fixed masks in turn, each allowing a random half of the vocabulary, and takes any token
    (llguidance's own mask work, 10-300 us per row on a CPU core, is not in it)."""

    def __init__(self, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.masks = [bytes(torch.randint(0, 256, ((vocab + 7) // 8,), generator=g, dtype=torch.uint8).tolist())
                      for _ in range(4)]
        self.n = 0

    def allowed(self) -> bytes:
        self.n += 1
        return self.masks[self.n % 4]

    def accept(self, token: int) -> bool:
        return True


def guided_loop_figures(runner: ModelRunner, spec: ModelSpec) -> dict:
    """What structured output costs the engine loop besides llguidance (greedy, 1k context, batch
    1, 64, 256): every row guided (RotatingMasks: a mask upload and apply per step, and no
    overlapped steps), beside plain decode with overlap on and off."""
    batches = (1, 64, 256)
    run = lambda **kw: {str(b): loop_decode(runner, spec, b, 1024, **kw) for b in batches}  # noqa: E731
    res = {"decode_loop_greedy_tok_s_by_batch": run(overlap=True),
           "decode_loop_no_overlap_tok_s_by_batch": run(overlap=False),
           "decode_loop_guided_tok_s_by_batch": run(overlap=True, guide=lambda: RotatingMasks(spec.vocab_size, 0))}
    res["guided_over_greedy"] = {b: res["decode_loop_guided_tok_s_by_batch"][b] / res["decode_loop_greedy_tok_s_by_batch"][b]
                                 for b in res["decode_loop_greedy_tok_s_by_batch"]}
    return res


def prefill_figures(runner: ModelRunner, spec: ModelSpec, wbytes: int, mm_tflops: float) -> dict:
    """Prefill tok/s and TTFT at 512, 2k, 8k tokens; the 8k rate over the measured matmul rate."""
    out: dict = {}
    run = lambda step: (lambda: runner.execute(step))  # noqa: E731
    pf_tok, ttft = {}, {}
    for n in (512, 2048, 8192):
        t = timed(run(prefill_step(n, spec.vocab_size)), iters=5)
        pf_tok[str(n)], ttft[str(n)] = n / t, t * 1000
    out["prefill_tok_s"], out["ttft_ms"] = pf_tok, ttft
    params = wbytes / runner.kv_pool.element_size()
    flops = 2 * params * 8192  # 2 FLOP per weight per token; attention FLOPs left out (a lower bound)
    out["prefill_matmul_ratio"] = flops / (ttft["8192"] / 1000) / (mm_tflops * 1e12)
    return out


def cpu_overhead(runner: ModelRunner, spec: ModelSpec, gpu_step_s: float) -> float:
    """Host time to schedule 256 running sequences, check and stage their inputs (what a CUDA-graph
    step copies, else the eager tensors) and apply the results, over one step's time."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=256, max_model_len=4096), BlockManager(runner.num_blocks, BS))
    for i in range(256):
        blocks = sched.blocks.allocate(1024 // BS + 1)
        sched.add(Sequence(f"s{i}", list(range(1024)), GREEDY, output_ids=[7], block_table=blocks,
                           num_computed=1024, status=SeqStatus.RUNNING))
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        step = sched.schedule()
        runner.check(step)  # the runner's whole host side of a step: checks, then inputs
        if runner.graphed(step):
            runner.graphs.stage(step.seqs)
        else:
            runner._prepare(step.seqs)
        sched.update(step, __import__("pdserve.core.step_io", fromlist=["StepOutput"]).StepOutput(
            {s.request_id: 7 for s in step.seqs}))
        times.append(time.perf_counter() - t0)
    sync()
    return statistics.median(times) / gpu_step_s


def hf_generate(spec: ModelSpec, runner: ModelRunner) -> dict:
    """transformers generate() on the same weights, 128-token prompts, 64 new tokens."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.for_model(**{k: v for k, v in json.loads(
            (CONFIGS / f"{spec_name(spec)}.json").read_text()).items() if k != "architectures"})
        with runner.device:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.eval()
        copy_weights_into(model, runner)
        res = {}
        for b in (1, 32):
            ids = torch.randint(0, spec.vocab_size, (b, 128), device=runner.device)
            gen = lambda: model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)  # noqa: E731
            t = timed(gen, iters=3, warmup=1)
            res[str(b)] = b * 64 / t
        del model
        return res
    except Exception as e:  # report, never hide: the key is absent and the reason recorded
        return {"error": repr(e)}


@torch.no_grad()
def copy_weights_into(model: torch.nn.Module, runner: ModelRunner) -> None:
    """Our fused weights (qkv, gate_up; stacked experts) split back into the HF modules' tensors."""
    from pdserve.model.loader import copy_into_hf

    copy_into_hf(runner.spec, runner.model.w, model.state_dict())


def spec_name(spec: ModelSpec) -> str:
    return "llama-3.1-8b" if spec.arch == "llama" else "qwen2.5-7b"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="llama-3.1-8b,qwen2.5-7b")
    p.add_argument("--commit", default="", help="recorded in the JSON (default: pdserve.bench.provenance)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {','.join(SECTIONS + OPTIONAL)}")
    a = p.parse_args()
    sections = tuple(a.sections.split(","))
    if unknown := set(sections) - set(SECTIONS + OPTIONAL):
        p.error(f"--sections: unknown {sorted(unknown)}; choose from {SECTIONS + OPTIONAL}")
    torch.manual_seed(0)
    commit = a.commit or source_commit()
    res = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "commit": commit or "unknown", "torch": torch.__version__}
    res["copy_GBps"], res["matmul_TFLOPs"] = copy_bandwidth(), matmul_tflops()
    res["sections"] = list(sections)
    auto = bench_decode(64, 4096, res["copy_GBps"])[0]  # the default split-K heuristic
    res["paged_attention_GBps"], res["paged_attention_bw_ratio"] = auto["gb_s"], auto["frac_of_copy"]
    res["models"] = {}
    for name in a.models.split(","):
        res["models"][name] = bench_model(name, res["copy_GBps"], res["matmul_TFLOPs"], sections)
        Path(a.out).write_text(json.dumps(res, indent=1))
        print(json.dumps({name: res["models"][name]}, indent=1), flush=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"copy {res['copy_GBps']:.0f} GB/s  matmul {res['matmul_TFLOPs']:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
