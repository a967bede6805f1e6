"""Serving matrix on the GPU machine: disaggregated vs colocated pdserve vs transformers' generate().

python bench/serve_matrix.py --commit HASH --out-dir DIR [--num-gpus 1] [--rates 4,8,16,32,inf]
python bench/serve_matrix.py --smoke --out-dir /tmp/sm        # tiny random config on CPU, 2 rates x 6 prompts
python bench/serve_matrix.py --plot-only DIR/serve-h200-DATE.json

The model is the Llama-3.1-8B shape (bench/configs/llama-3.1-8b.json) with dummy weights: the
folder holds config.json and a word-level tokenizer of the config's vocabulary ("t0 t1 ...", so
the gateway runs offline) and no weights; workers run with --load-format dummy.

Modes (every mode serves the same request set at each rate: random dataset, same seed per rate):
  disaggregated  gateway + prefill worker + decode worker (KV over tcp). One GPU: both workers on
                 GPU 0 with --gpu-memory-utilization 0.4 each ("shared_gpu": true). N >= 2 GPUs:
                 N//2 prefill and N - N//2 decode workers, one GPU each, 0.85.
  colocated      gateway + one worker running both phases per GPU (N replicas), 0.85.
  transformers   the naive baseline: HF generate() on the same shapes (random weights), one static
                 batch at a time (see TRANSFORMERS_METHOD).
pdserve modes are measured with `pdserve bench`'s engine (pdserve.bench.runner.run, gRPC backend)
in-process against the stack's gateway. After each (mode, rate) the partial JSON is rewritten.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdserve.bench import arrivals, datasets, report  # noqa: E402
from pdserve.bench.metrics import RequestOutput, compute  # noqa: E402

import trace_summary  # noqa: E402  (bench/, on sys.path when run as a script)

CONFIGS = ROOT / "bench" / "configs"
SLOS_MS = {"ttft": 200.0, "tpot": 30.0}
MODES = ("disaggregated", "colocated", "transformers")
SMOKE_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "head_dim": 16,
    "vocab_size": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 1024,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
}
TRANSFORMERS_METHOD = (
    "One process, HF AutoModelForCausalLM.from_config (same config, random bf16 weights, default "
    "attention), greedy generate() with min_new_tokens = max_new_tokens = the longest output of the "
    "batch. Requests arrive at the same Poisson times as for pdserve; whenever the model is idle it "
    "takes up to MAX_BATCH queued requests in arrival order (left-padded) as one static batch and "
    "runs it to the end before taking the next (waiting for the next arrival when the queue is "
    "empty). Token times come from a generate() streamer (each step's tokens are copied to the "
    "host, so each time is after the GPU finished the step). Per request: TTFT = first token time "
    "- arrival time (queueing included); ITL = gaps between its token times; E2EL = time of its own "
    "last token (output_len-th) - arrival (as if streamed, generous: the batch keeps running for "
    "longer requests); duration = first arrival schedule start to last completion. Metrics then "
    "computed by pdserve.bench.metrics.compute, exactly as for the pdserve modes."
)


# --------------------------------------------------------------------------- model folder

def make_model_folder(config: dict[str, Any], folder: Path) -> Path:
    """config.json + a word-level tokenizer of the config's vocabulary; no weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    n = int(config["vocab_size"])
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(n)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------- pdserve stacks

def pdserve_stack(mode: str, folder: Path, a: argparse.Namespace):
    """A launch.Stack for mode whose workers each get their own CUDA_VISIBLE_DEVICES."""
    from pdserve.launch import Proc, Stack, free_port

    common = ["--load-format", "dummy", "--max-model-len", str(a.max_model_len),
              "--max-num-seqs", str(a.max_num_seqs)]
    if a.smoke:
        common += ["--device", "cpu", "--dtype", "float32", "--kv-cache-memory", str(64 << 20)]
    else:
        common += ["--device", "cuda"]
    shared = a.num_gpus == 1

    def gpu_args(util: float) -> list[str]:
        return [] if a.smoke else ["--gpu-memory-utilization", str(util)]

    if mode == "colocated":
        plan = [(f"colocated{'' if i == 0 else i + 1}", "decode_service", i,
                 [*common, *gpu_args(0.85), "--role", "colocated"]) for i in range(a.num_gpus)]
    else:
        n_pre = max(1, a.num_gpus // 2)
        n_dec = max(1, a.num_gpus - n_pre)
        util = 0.4 if shared else 0.85
        kv = ["--kv-transfer", a.kv_transfer]
        plan = [(f"prefill{'' if i == 0 else i + 1}", "prefill_service", 0 if shared else i,
                 [*common, *gpu_args(util), *kv]) for i in range(n_pre)]
        plan += [(f"decode{'' if i == 0 else i + 1}", "decode_service", 0 if shared else n_pre + i,
                  [*common, *gpu_args(util), *kv]) for i in range(n_dec)]

    class MatrixStack(Stack):
        def _spawn_workers(self) -> dict[str, Proc]:
            procs = {}
            for name, module, gpu, args in plan:
                procs[name] = self._spawn_on(name, module, args, gpu)
            return procs

        def _spawn_on(self, name: str, module: str, args: list[str], gpu: int) -> Proc:
            import threading

            port = free_port()
            cmd = [sys.executable, "-u", "-m", module, "--port", str(port), *self.model_args, *args]
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            if not a.smoke:
                env["CUDA_VISIBLE_DEVICES"] = str(gpu)
            popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, cwd=ROOT)
            proc = Proc(name, f"127.0.0.1:{port}", popen)
            threading.Thread(target=proc.pump, args=(self.echo,), daemon=True).start()
            self.procs[name] = proc
            return proc

    return MatrixStack(model=str(folder), gateway_args=["--max-model-len", str(a.max_model_len)],
                       colocated=mode == "colocated")


def workload(a: argparse.Namespace, vocab: int, seed: int) -> list[datasets.BenchRequest]:
    return datasets.random_requests(a.num_prompts, a.input_len, a.output_len, a.range_ratio, vocab, seed)


def rate_seed(i: int) -> int:
    """Distinct prompts per rate (no prefix-cache reuse across rates), the same for every mode."""
    return 1000 + i


async def bench_pdserve(address: str, a: argparse.Namespace, vocab: int, rates: list[float], sink) -> None:
    from pdserve.bench.backends import GrpcBackend
    from pdserve.bench.runner import RunConfig, run, warmup

    backend = GrpcBackend(address, timeout=a.request_timeout)
    try:
        warm = workload(a, vocab, seed=7)[:a.num_warmups]
        t0 = time.monotonic()
        failed = await warmup(backend, warm, None)
        log(f"  warmup {len(warm)} requests in {time.monotonic() - t0:.1f}s ({failed} failed)")
        for i, rate in enumerate(rates):
            if not sink.has_time(a.num_prompts / rate if math.isfinite(rate) else 0.0, 15.0):
                sink.skip(rate, "out of time budget")
                continue
            cfg = RunConfig(rate, 1.0, None, a.seed + i, False, SLOS_MS)
            res = await run(backend, workload(a, vocab, rate_seed(i)), cfg)
            sink.record(rate, res.metrics, res.outputs)
    finally:
        await backend.close()


def run_pdserve_mode(mode: str, folder: Path, a: argparse.Namespace, vocab: int, rates: list[float], sink) -> None:
    t0 = time.monotonic()
    trace_file = Path(a.out_dir) / f"traces-{mode}.jsonl" if a.trace else None
    if trace_file is not None:  # every process of the stack inherits it (see pdserve/telemetry.py)
        trace_file.unlink(missing_ok=True)
        os.environ["PDSERVE_TRACE_FILE"] = str(trace_file)
    st = pdserve_stack(mode, folder, a)
    try:
        st.start(timeout=a.start_timeout)
        log(f"  stack up in {time.monotonic() - t0:.1f}s: {st.workers}")
        sink.note("startup_s", round(time.monotonic() - t0, 1))
        asyncio.run(bench_pdserve(st.gateway, a, vocab, rates, sink))
    finally:
        st.stop()
        if trace_file is not None:
            os.environ.pop("PDSERVE_TRACE_FILE", None)
            if trace_file.exists():
                sink.note("span_ms", trace_summary.summarise(trace_file))
        logs = Path(a.out_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for name, p in st.procs.items():
            (logs / f"{mode}-{name}.log").write_text("".join(p.lines[-400:]))


# --------------------------------------------------------------------------- transformers baseline

def run_transformers_mode(config: dict[str, Any], a: argparse.Namespace, rates: list[float], sink) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer

    device = torch.device("cpu" if a.smoke else "cuda")
    dtype = torch.float32 if a.smoke else torch.bfloat16
    t0 = time.monotonic()
    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    sink.note("startup_s", round(time.monotonic() - t0, 1))
    log(f"  HF model ready in {time.monotonic() - t0:.1f}s")

    class Clock(BaseStreamer):
        def __init__(self) -> None:
            self.calls = 0
            self.times: list[float] = []

        def put(self, value: Any) -> None:
            self.calls += 1
            if self.calls > 1:  # the first put is the prompt
                self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    @torch.inference_mode()
    def generate(batch: list[datasets.BenchRequest]) -> list[float]:
        width = max(r.prompt_len for r in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(batch):  # left padding
            ids[j, width - r.prompt_len:] = torch.tensor(r.prompt_ids)
            mask[j, width - r.prompt_len:] = 1
        n = max(r.output_len for r in batch)
        clock = Clock()
        model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0, streamer=clock)
        return clock.times

    warm = workload(a, config["vocab_size"], seed=7)[:max(1, min(a.num_warmups, a.max_batch))]
    tw = time.monotonic()
    generate(warm)
    log(f"  warmup batch of {len(warm)} in {time.monotonic() - tw:.1f}s")
    for i, rate in enumerate(rates):
        if not sink.has_time(a.num_prompts / rate if math.isfinite(rate) else 0.0, 20.0):
            sink.skip(rate, "out of time budget")
            continue
        reqs = workload(a, config["vocab_size"], rate_seed(i))
        due = list(__import__("itertools").accumulate(arrivals.intervals(len(reqs), rate, 1.0, a.seed + i)))
        outs = [RequestOutput(prompt_len=r.prompt_len) for r in reqs]
        start = time.perf_counter()
        nxt = 0
        while nxt < len(reqs):
            now = time.perf_counter() - start
            if due[nxt] > now:
                time.sleep(due[nxt] - now)
                now = due[nxt]
            take = [k for k in range(nxt, len(reqs)) if due[k] <= now][:a.max_batch]
            times = generate([reqs[k] for k in take])
            for k in take:
                o, mine = outs[k], times[:reqs[k].output_len]
                o.start = start + due[k]
                o.ttft = mine[0] - o.start
                o.itl = [b - c for c, b in zip(mine, mine[1:])]
                o.latency = mine[-1] - o.start
                o.output_len, o.success = len(mine), len(mine) == reqs[k].output_len
            nxt = take[-1] + 1
        duration = max(o.start + o.latency for o in outs) - start
        sink.record(rate, compute(outs, duration, SLOS_MS), outs)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- results

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def summarise(m: dict[str, float]) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    for name in ("ttft", "tpot", "itl", "e2el"):
        rec[f"{name}_ms"] = {"mean": m[f"mean_{name}_ms"], "p50": m[f"median_{name}_ms"],
                             "p90": m[f"p90_{name}_ms"], "p99": m[f"p99_{name}_ms"]}
    rec["goodput"] = m.get("request_goodput", 0.0)
    for k in ("request_throughput", "output_throughput", "total_token_throughput", "completed", "failed",
              "duration", "total_input_tokens", "total_output_tokens"):
        rec[k] = m[k]
    return rec


class Sink:
    """Collects run records, rewrites the JSON after each, and keeps the time budget."""

    def __init__(self, doc: dict[str, Any], path: Path, deadline: float) -> None:
        self.doc, self.path, self.deadline, self.mode = doc, path, deadline, ""
        self.notes: dict[str, dict[str, Any]] = {}

    def has_time(self, run_s: float, slack_s: float) -> bool:
        return time.monotonic() + run_s + slack_s < self.deadline

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def note(self, key: str, value: Any) -> None:
        self.notes.setdefault(self.mode, {})[key] = value
        self.doc["modes"] = self.notes
        self.save()

    def record(self, rate: float, metrics: dict[str, float], outputs: list[RequestOutput]) -> None:
        rec = {"mode": self.mode, "request_rate": rate, **summarise(metrics)}
        errors = sorted({o.error for o in outputs if o.error})[:3]
        if errors:
            rec["errors"] = errors
        self.doc["runs"].append(rec)
        self.save()
        log(f"  {self.mode:<13} rate {rate:>5g}: ttft p50/p90 {rec['ttft_ms']['p50']:8.1f}/{rec['ttft_ms']['p90']:8.1f} ms"
            f"  tpot p50/p90 {rec['tpot_ms']['p50']:6.1f}/{rec['tpot_ms']['p90']:6.1f} ms  goodput {rec['goodput']:6.2f}"
            f"  req/s {rec['request_throughput']:6.2f}  out tok/s {rec['output_throughput']:8.1f}"
            f"  ok {rec['completed']}/{rec['completed'] + rec['failed']}  ({self.left():.0f}s left)")

    def skip(self, rate: float, why: str) -> None:
        self.doc["runs"].append({"mode": self.mode, "request_rate": rate, "skipped": why})
        self.save()
        log(f"  {self.mode} rate {rate:g}: skipped ({why})")

    def error(self, why: str) -> None:
        self.notes.setdefault(self.mode, {})["error"] = why
        self.doc["modes"] = self.notes
        self.save()

    def save(self) -> None:
        report.save_json(self.path, self.doc)


def gpu_name(smoke: bool) -> str:
    if smoke:
        return "cpu"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()
        return out[0].strip() if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_slug(name: str) -> str:
    """"NVIDIA H200" -> "h200"."""
    words = [w for w in name.replace("-", " ").split() if w.lower() not in ("nvidia", "geforce", "tesla")]
    return (words[0] if words else name or "gpu").lower()


# --------------------------------------------------------------------------- plot

def plot(path: Path) -> Path | None:
    """Goodput, TTFT p90 and TPOT p90 against request rate, one line per mode (inf at the right)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no plot")
        return None
    doc = json.loads(path.read_text())
    runs = [r for r in doc["runs"] if "skipped" not in r]
    rates = sorted({float(r["request_rate"]) for r in runs})
    xs = {r: i for i, r in enumerate(rates)}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = (("goodput", "goodput (req/s), TTFT p90<=200ms & TPOT p90<=30ms", None),
              ("ttft_ms", "TTFT p90 (ms)", 200.0), ("tpot_ms", "TPOT p90 (ms)", 30.0))
    for ax, (key, label, slo) in zip(axes, panels):
        for mode in MODES:
            pts = sorted((float(r["request_rate"]), r[key] if key == "goodput" else r[key]["p90"])
                         for r in runs if r["mode"] == mode)
            if pts:
                ax.plot([xs[p] for p, _ in pts], [v for _, v in pts], marker="o", label=mode)
        if slo:
            ax.axhline(slo, color="grey", ls="--", lw=1)
            ax.set_yscale("log")
        ax.set_xticks(range(len(rates)), ["inf" if math.isinf(r) else f"{r:g}" for r in rates])
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    share = ", prefill+decode share one GPU" if doc.get("shared_gpu") else ""
    fig.suptitle(f"{doc.get('model', '')} on {doc['num_gpus']}x {doc['gpu']}{share}; random {doc['input_len']}/"
                 f"{doc['output_len']} (range {doc['range_ratio']}), {doc['num_prompts']} prompts/rate", fontsize=10)
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    log(f"saved {png}")
    return png


def table(path: Path) -> str:
    """Markdown table: per rate, the three modes side by side, and the ratios to transformers/colocated."""
    doc = json.loads(path.read_text())
    by = {(r["mode"], str(r["request_rate"])): r for r in doc["runs"] if "skipped" not in r}
    rates = sorted({str(r["request_rate"]) for r in doc["runs"] if "skipped" not in r}, key=lambda s: float(s))
    show = lambda rate: f"{float(rate):g}"  # noqa: E731
    lines = ["| rate | mode | TTFT p50 / p90 (ms) | TPOT p50 / p90 (ms) | goodput (req/s) | req/s | out tok/s |",
             "|---|---|---|---|---|---|---|"]
    for rate in rates:
        for mode in MODES:
            r = by.get((mode, rate))
            if r:
                lines.append(f"| {show(rate)} | {mode} | {r['ttft_ms']['p50']:.0f} / {r['ttft_ms']['p90']:.0f} | "
                             f"{r['tpot_ms']['p50']:.1f} / {r['tpot_ms']['p90']:.1f} | {r['goodput']:.2f} | "
                             f"{r['request_throughput']:.2f} | {r['output_throughput']:.0f} |")
    lines += ["", "| rate | goodput disagg : coloc : HF | out tok/s disagg / coloc | out tok/s disagg / HF | "
                  "TTFT p90 disagg / coloc | TPOT p90 disagg / coloc |", "|---|---|---|---|---|---|"]
    for rate in rates:
        d, c, h = (by.get((m, rate)) for m in MODES)
        if not (d and c):
            continue
        ratio = lambda x, y: f"{x / y:.2f}x" if y else "-"  # noqa: E731
        lines.append(f"| {show(rate)} | {d['goodput']:.2f} : {c['goodput']:.2f} : {h['goodput'] if h else float('nan'):.2f} | "
                     f"{ratio(d['output_throughput'], c['output_throughput'])} | "
                     f"{ratio(d['output_throughput'], h['output_throughput']) if h else '-'} | "
                     f"{ratio(d['ttft_ms']['p90'], c['ttft_ms']['p90'])} | {ratio(d['tpot_ms']['p90'], c['tpot_ms']['p90'])} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--commit", default="", help="commit hash of the code (the device copy has no .git)")
    p.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    p.add_argument("--num-gpus", type=int, default=1)
    p.add_argument("--kv-transfer", default="tcp", choices=["tcp", "cuda_ipc", "nccl"],
                   help="KV transfer backend of the disaggregated mode")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--rates", default="4,8,16,32,inf")
    p.add_argument("--config", default=str(CONFIGS / "llama-3.1-8b.json"))
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--num-warmups", type=int, default=8)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.5)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-batch", type=int, default=32, help="transformers: static batch size cap")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting runs after this many seconds")
    p.add_argument("--start-timeout", type=float, default=240.0)
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--smoke", action="store_true", help="tiny random config on CPU, 2 rates x 6 prompts")
    p.add_argument("--trace", action="store_true",
                   help="trace every request to <out-dir>/traces-<mode>.jsonl and add span_ms per mode "
                        "(time per span name: where TTFT goes); costs a file write per span")
    p.add_argument("--plot-only", default=None, help="re-plot (and print the table of) an existing JSON")
    a = p.parse_args(argv)
    if a.smoke:
        a.rates, a.num_prompts, a.num_warmups = "8,inf", 6, 2
        a.input_len, a.output_len, a.max_model_len, a.max_num_seqs, a.max_batch = 32, 8, 128, 8, 4
    return a


def main(argv: list[str] | None = None) -> Path:
    a = parse_args(argv)
    if a.plot_only:
        plot(Path(a.plot_only))
        print(table(Path(a.plot_only)))
        return Path(a.plot_only)
    t_start = time.monotonic()
    config = dict(SMOKE_CONFIG) if a.smoke else json.loads(Path(a.config).read_text())
    rates = [float(x) for x in a.rates.split(",")]
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown modes {bad}; choose from {MODES}")
    gpu = gpu_name(a.smoke)
    date = datetime.date.today().isoformat()
    path = Path(a.out_dir) / f"serve-{gpu_slug(gpu)}-{date}.json"
    doc: dict[str, Any] = {
        "gpu": gpu, "date": date, "commit": a.commit or "unknown", "num_gpus": a.num_gpus, "kv_transfer": a.kv_transfer,
        "shared_gpu": a.num_gpus == 1 and not a.smoke,
        "model": "tiny-random (smoke)" if a.smoke else Path(a.config).stem + " (dummy weights)",
        "dataset": "random", "input_len": a.input_len, "output_len": a.output_len, "range_ratio": a.range_ratio,
        "num_prompts": a.num_prompts, "num_warmups": a.num_warmups, "arrivals": "poisson (burstiness 1)",
        "goodput_slos_ms": SLOS_MS, "goodput_flag": "--goodput ttft:200 tpot:30",
        "max_model_len": a.max_model_len, "max_num_seqs": a.max_num_seqs,
        "layout": {
            "disaggregated": ("prefill + decode on GPU 0, --gpu-memory-utilization 0.4 each" if a.num_gpus == 1
                              else f"{max(1, a.num_gpus // 2)} prefill + {a.num_gpus - max(1, a.num_gpus // 2)} decode, one GPU each, 0.85"),
            "colocated": f"{a.num_gpus} colocated worker(s), one per GPU, 0.85",
            "transformers": "one HF model on GPU 0",
        },
        "client": "pdserve bench engine (pdserve.bench.runner.run), --backend grpc, in-process",
        "transformers_method": TRANSFORMERS_METHOD.replace("MAX_BATCH", str(a.max_batch)),
        "runs": [],
    }
    sink = Sink(doc, path, t_start + a.budget_s)
    log(f"{gpu}: modes {modes}, rates {rates}, {a.num_prompts} prompts each; writing {path}")
    tmp = Path(tempfile.mkdtemp(prefix="serve-matrix-"))
    try:
        t0 = time.monotonic()
        folder = make_model_folder(config, tmp / ("tiny" if a.smoke else Path(a.config).stem))
        log(f"model folder {folder} in {time.monotonic() - t0:.1f}s")
        for mode in modes:
            sink.mode = mode
            log(f"== {mode} ({sink.left():.0f}s left)")
            if not sink.has_time(30.0, 20.0):
                for r in rates:
                    sink.skip(r, "out of time budget")
                continue
            try:
                if mode == "transformers":
                    run_transformers_mode(config, a, rates, sink)
                else:
                    run_pdserve_mode(mode, folder, a, config["vocab_size"], rates, sink)
            except Exception as e:  # record and go on with the next mode
                traceback.print_exc()
                sink.error(f"{type(e).__name__}: {str(e)[-2000:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc["total_s"] = round(time.monotonic() - t_start, 1)
    sink.save()
    log(f"saved {path} after {doc['total_s']}s")
    plot(path)
    print(table(path))
    return path


if __name__ == "__main__":
    main()
