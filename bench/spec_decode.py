"""Batch-1 decode tokens/s with and without speculation, same run, serving code path.

    python bench/spec_decode.py --out bench/results/spec-cpu-$(date -u +%F).json
    python bench/spec_decode.py --device cuda --dtype bfloat16 --out bench/results/spec-h200-DATE.json
    python bench/spec_decode.py --device cuda --load-format dummy --model DIR_WITH_CONFIG ...
    python bench/spec_decode.py --speculative-config '{"model": DRAFT_DIR, "num_speculative_tokens": 4}'

Each request runs alone through the decode worker's own pieces (Scheduler + DraftPlanner +
SpeculativeRunner over a ModelRunner; no gRPC): one prefill step, then decode steps until
max_tokens. Decode tokens/s = tokens after the first / wall time of the decode steps. Modes
alternate per prompt and repeat, so machine load hits both alike. The workload is prompt
lookup: prompts that contain the text the model goes on to produce (a list to repeat, code to
copy with one change). Greedy; the two modes' tokens are compared (they must be equal). With
--load-format dummy the weights are random, drafts are (almost) never accepted, and the
figure measures only the cost of speculation, not its gain.

    python bench/spec_decode.py --device cuda --dtype bfloat16 --load-format dummy --model LLAMA_CONFIG_DIR \
        --speculative-config '{"model": "(first layers)", "num_speculative_tokens": 4}' \
        --draft-layers 1 --draft-noise 0,0.5,1,2 --out F

times draft-model speculation on random weights with a draft of known quality
(pdserve/bench/layer_draft.py): the target keeps its cost but its layers from N on add nothing,
the draft is its first N layers, each --draft-noise level perturbs the draft's head (0: every
draft right). One result per level, each with its own plain baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from pdserve.bench.layer_draft import layer_draft, silence_layers_from
from pdserve.bench.provenance import source_commit
from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Sequence
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.core.spec_schedule import DraftPlanner
from pdserve.core.speculative import SpeculativeConfig
from pdserve.model.prepare import resolve_model
from pdserve.model.spec import ModelSpec
from pdserve.runtime.draft_model import DraftModelProposer
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.spec_step import SpeculativeRunner

PROMPTS = [
    "Repeat the list exactly.\nList: apples, bananas, cherries, dates, elderberries, figs, grapes, kiwis, "
    "lemons, mangoes.\nRepeat: apples, bananas, cherries, dates, elderberries, figs, grapes, kiwis, lemons, "
    "mangoes.\nList: red, orange, yellow, green, blue, indigo, violet, black, white, grey.\nRepeat:",
    "Copy the function, renaming total to acc.\n\ndef mean(values):\n    total = 0\n    count = 0\n"
    "    for v in values:\n        total += v\n        count += 1\n    if count == 0:\n        return 0.0\n"
    "    return total / count\n\nCopy:\n\ndef mean(values):\n",
    "The meeting notes, copied verbatim.\nNotes: The team agreed to ship the release on Friday. Alice will "
    "update the changelog, Bob will run the final tests, and Carol will announce it on the mailing list.\n"
    "Copy: The team agreed to ship the release on Friday. Alice will",
]


def tokenize(model_dir: Path, texts: list[str], vocab: int) -> list[list[int]]:
    """The model's tokenizer, or (a folder with config.json only) a fixed id sequence given twice."""
    try:
        from gateway.tokenizer import load_tokenizer

        tok = load_tokenizer(model_dir)
        return [tok.encode(t) for t in texts]
    except Exception:  # noqa: BLE001 - dummy folders have no tokenizer files
        base = [(i * 7919) % (vocab - 1) + 1 for i in range(64)]
        return [base * 2 + base[: 8 * (i + 1)] for i in range(len(texts))]


def run_one(runner: ModelRunner, prompt: list[int], max_tokens: int, spec: SpeculativeConfig | None,
            sync, engine: SpeculativeRunner | None = None, draft: ModelRunner | None = None) -> dict:
    """One request alone; returns its tokens, decode seconds and speculation counters.
    `draft`: the draft model's runner (method draft_model)."""
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=max(2048, len(prompt)),
                          max_model_len=runner.max_model_len, enable_prefix_caching=False)
    proposer = DraftModelProposer(draft, runner.spec.vocab_size) if draft is not None and spec else None
    planner = DraftPlanner(spec, cfg.max_model_len, proposer=proposer) if spec else None
    sched = Scheduler(cfg, BlockManager(runner.num_blocks, runner.block_size), planner)
    engine = (engine or SpeculativeRunner(runner)) if spec else runner
    sched.add(Sequence("r", list(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)))
    tokens: list[int] = []
    steps, t0 = 0, 0.0
    while sched.has_work:
        step = sched.schedule()
        tokens += [e.token for e in sched.update(step, engine.execute(step))]
        steps += 1
        if steps == 1:  # the prefill step: timing starts once the first token is out
            sync()
            t0 = time.perf_counter()
    sync()
    seconds = time.perf_counter() - t0
    st = planner.stats if planner else None
    return dict(tokens=tokens, decode_seconds=seconds, decode_steps=steps - 1,
                drafted=st.proposed if st else 0, accepted=st.accepted if st else 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: torch's default; 1 avoids spin-wait collapse on a busy host)")
    ap.add_argument("--speculative-config", default='{"method": "ngram", "num_speculative_tokens": 4, '
                                                    '"prompt_lookup_max": 4, "prompt_lookup_min": 1}')
    ap.add_argument("--draft-layers", type=int, default=0,
                    help="draft = the target's first N layers, the target's later layers silenced (dummy weights)")
    ap.add_argument("--draft-noise", default="0", help="with --draft-layers: comma-separated noise levels")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = SpeculativeConfig.parse(args.speculative_config)
    if args.draft_layers and (args.load_format != "dummy" or spec.method != "draft_model"):
        ap.error("--draft-layers needs --load-format dummy and a draft-model --speculative-config")
    model_dir = resolve_model(args.model, require_weights=args.load_format != "dummy")
    mspec = ModelSpec.from_dir(model_dir)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    runner = ModelRunner(mspec, model_dir, device=device, dtype=dtype, num_blocks=256,
                         block_size=16, load_format=args.load_format, max_model_len=1024, max_num_seqs=1)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    prompts = tokenize(model_dir, PROMPTS, mspec.vocab_size)
    engine = SpeculativeRunner(runner, spec.num_speculative_tokens)  # the decode worker's: verify graphs on CUDA
    if args.draft_layers:
        silence_layers_from(runner, args.draft_layers)
        results = {}
        for noise in (float(x) for x in args.draft_noise.split(",")):
            draft = layer_draft(runner, args.draft_layers, noise=noise, num_blocks=256, max_num_seqs=1)
            res = measure(runner, prompts, spec, sync, engine, draft, args, mspec, device)
            results[str(noise)] = res | {"draft": f"first {args.draft_layers} layers of the target, head noise {noise}"}
            del draft
        res = {"bench": "spec_decode_layer_draft", "draft_layers": args.draft_layers, "by_noise": results,
               "construction": (layer_draft.__module__ + ": the target's layers from draft_layers on have zero "
                                "o/down projections (same cost per step), the draft is its first layers")}
    else:
        draft = None
        if spec.method == "draft_model":
            draft_dir = resolve_model(spec.model, require_weights=args.load_format != "dummy")
            draft = ModelRunner(ModelSpec.from_dir(draft_dir), draft_dir, device=device, dtype=dtype, num_blocks=256,
                                block_size=16, load_format=args.load_format, max_model_len=1024, max_num_seqs=1)
        res = measure(runner, prompts, spec, sync, engine, draft, args, mspec, device)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


def measure(runner: ModelRunner, prompts: list[list[int]], spec: SpeculativeConfig, sync, engine: SpeculativeRunner,
            draft: ModelRunner | None, args: argparse.Namespace, mspec: ModelSpec, device: torch.device) -> dict:
    """Warm-up, then plain and speculative runs alternating per prompt; the report."""
    for p in prompts:  # warm-up: one untimed repeat. Greedy runs repeat their step shapes exactly,
        run_one(runner, p, args.max_tokens, spec, sync, engine, draft)  # so the timed ones meet
        run_one(runner, p, args.max_tokens, None, sync)  # no first-call costs (Triton compiles)
    runs: dict[str, list[dict]] = {"plain": [], "spec": []}
    for _ in range(args.repeats):
        for p in prompts:
            for mode, cfg in (("plain", None), ("spec", spec)):
                r = run_one(runner, p, args.max_tokens, cfg, sync, engine, draft)
                runs[mode].append(r)
                print(mode, len(p), f"{(len(r['tokens']) - 1) / r['decode_seconds']:.1f} tok/s",
                      r["decode_steps"], "steps", r["accepted"], "/", r["drafted"], "accepted", flush=True)
    return report(runs, args, mspec, device, engine.graphs is not None)


def report(runs: dict[str, list[dict]], args: argparse.Namespace, mspec: ModelSpec, device: torch.device,
           engine_graphs: bool = False) -> dict:
    def tps(rs: list[dict]) -> float:  # all decode tokens over all decode time
        return sum(len(r["tokens"]) - 1 for r in rs) / sum(r["decode_seconds"] for r in rs)

    plain, ngram = runs["plain"], runs["spec"]
    m = SpeculativeConfig.parse(args.speculative_config).method  # the keys name it: ngram_..., draft_model_...
    drafted, accepted = sum(r["drafted"] for r in ngram), sum(r["accepted"] for r in ngram)
    per_run = [(len(b["tokens"]) - 1) / b["decode_seconds"] / ((len(a["tokens"]) - 1) / a["decode_seconds"])
               for a, b in zip(plain, ngram)]
    return {
        "bench": "spec_decode", "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": source_commit(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "model": args.model or "SmolLM2-135M-Instruct", "load_format": args.load_format, "dtype": args.dtype,
        "batch": 1, "max_tokens": args.max_tokens, "prompts": len(PROMPTS), "repeats": args.repeats,
        "speculative_config": json.loads(args.speculative_config),
        "verify_graphs": engine_graphs,
        "plain_decode_tok_s": round(tps(plain), 2), f"{m}_decode_tok_s": round(tps(ngram), 2),
        "speedup": round(tps(ngram) / tps(plain), 3),
        "speedup_per_run_median": round(statistics.median(per_run), 3),
        "plain_decode_steps": sum(r["decode_steps"] for r in plain),
        f"{m}_decode_steps": sum(r["decode_steps"] for r in ngram),
        "drafted_tokens": drafted, "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
        "greedy_tokens_equal": all(a["tokens"] == b["tokens"] for a, b in zip(plain, ngram)),
        "runs": [dict(prompt=i % len(PROMPTS), plain_tok_s=round((len(a["tokens"]) - 1) / a["decode_seconds"], 2),
                      spec_tok_s=round((len(b["tokens"]) - 1) / b["decode_seconds"], 2),
                      plain_steps=a["decode_steps"], spec_steps=b["decode_steps"], drafted=b["drafted"],
                      accepted=b["accepted"], first_difference=first_difference(a["tokens"], b["tokens"]))
                 for i, (a, b) in enumerate(zip(plain, ngram))],
        "note": ("CPU timings on a shared machine are noisy; modes alternate per run. " if device.type == "cpu" else "")
                + "Dummy weights give ~zero acceptance. In bfloat16 the verify forward (k+1 tokens) and a "
                  "decode step round differently, so greedy tokens may part at a near-tie (first_difference); "
                  "in float32 they are equal (tests).",
    }


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


if __name__ == "__main__":
    main()
