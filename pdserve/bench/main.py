"""`pdserve bench`: arguments, the runs over each request rate, and what is printed and saved."""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from pathlib import Path
from typing import Any

from pdserve.bench import datasets, report
from pdserve.bench.backends import BACKENDS, Backend, make_backend
from pdserve.bench.metrics import detailed, parse_goodput
from pdserve.bench.provenance import source_commit
from pdserve.bench.runner import RunConfig, RunResult, run, warmup


def parser() -> argparse.ArgumentParser:
    """Flags named as `vllm bench serve` names them."""
    p = argparse.ArgumentParser(prog="pdserve bench", description="serving benchmark against a pdserve gateway")
    p.add_argument("--backend", default="grpc", choices=BACKENDS)
    p.add_argument("--address", default="127.0.0.1:50051", help="gateway host:port")
    p.add_argument("--model", default="", help="model name to send (default: whatever the gateway serves)")
    p.add_argument("--api-key", default=None, help="a gateway's --api-key (default: $PDSERVE_API_KEY, else $VLLM_API_KEY)")
    p.add_argument("--dataset-name", default="random", choices=datasets.DATASETS)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.0)
    p.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: tokens of the common prompt")
    p.add_argument("--vocab-size", type=int, default=32000, help="token ids are drawn from [0, vocab-size)")
    p.add_argument("--request-rate", default="inf", help="req/s, 'inf', or a list '1,2,4' (one run each)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps; 1 = Poisson")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--num-warmups", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goodput", nargs="+", default=[], metavar="NAME:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--timeout", type=float, default=None, help="per-request deadline, seconds")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--save-detailed", action="store_true", help="add per-request records to the JSON")
    p.add_argument("--result-dir", default=".")
    p.add_argument("--result-filename", default=None)
    p.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True, help="PNG plots with --save-result")
    p.add_argument("--disable-tqdm", action="store_true")
    return p


def parse_rates(text: str) -> list[float]:
    """'1,2,inf' -> [1.0, 2.0, inf]."""
    rates = [float(x) for x in text.split(",") if x.strip()]
    if not rates or any(r <= 0 or math.isnan(r) for r in rates):
        raise ValueError(f"--request-rate: expected positive numbers or inf, got {text!r}")
    return rates


async def bench(args: argparse.Namespace, backend: Backend | None = None) -> dict[str, Any]:
    """Every run of args (one per request rate); returns the JSON document and prints the tables."""
    slos, rates = parse_goodput(args.goodput), parse_rates(args.request_rate)
    backend = backend or make_backend(args.backend, args.address, args.model, args.timeout, args.api_key)
    try:
        max_len = await backend.max_model_len()
        requests = datasets.build(args.dataset_name, args.num_prompts + args.num_warmups, input_len=args.input_len,
                                  output_len=args.output_len, range_ratio=args.range_ratio, prefix_len=args.prefix_len,
                                  vocab_size=args.vocab_size, max_model_len=max_len, seed=args.seed)
        warm, measured = requests[:args.num_warmups], requests[args.num_warmups:]
        results: list[RunResult] = []
        for rate in rates:
            if warm and (failed := await warmup(backend, warm, args.max_concurrency)):
                print(f"warning: {failed} of {len(warm)} warmup requests failed")
            cfg = RunConfig(rate, args.burstiness, args.max_concurrency, args.seed, not args.disable_tqdm, slos)
            results.append(await run(backend, measured, cfg))
            print(report.table(results[-1].metrics, rate, args.max_concurrency))
    finally:
        await backend.close()
    return _document(args, slos, results)


def _document(args: argparse.Namespace, slos: dict[str, float], results: list[RunResult]) -> dict[str, Any]:
    """One flat vLLM-style record per run; a single run is the document itself, several go under runs."""
    runs = []
    for r in results:
        rec: dict[str, Any] = {"request_rate": r.config.request_rate, "burstiness": r.config.burstiness,
                               "max_concurrency": r.config.max_concurrency, **r.metrics}
        if args.save_detailed:
            rec["requests"] = detailed(r.outputs)
        runs.append(rec)
    head = {"date": time.strftime("%Y%m%d-%H%M%S"), "commit": source_commit(), "backend": args.backend,
            "address": args.address, "model_id": args.model, "dataset_name": args.dataset_name,
            "num_prompts": args.num_prompts, "num_warmups": args.num_warmups, "seed": args.seed,
            "input_len": args.input_len, "output_len": args.output_len, "range_ratio": args.range_ratio,
            "goodput_slos_ms": slos}
    doc = {**head, **runs[0]} if len(runs) == 1 else {**head, "runs": runs}
    doc["_results"] = results  # taken off before saving
    return doc


def save(args: argparse.Namespace, doc: dict[str, Any]) -> Path:
    """Writes the JSON (and plots next to it); returns the JSON path."""
    results: list[RunResult] = doc.pop("_results")
    name = args.result_filename or f"{args.backend}-{args.dataset_name}-{doc['date']}.json"
    path = Path(args.result_dir) / name
    report.save_json(path, doc)
    print(f"saved {path}")
    if args.plot:
        for png in report.plot(path.with_suffix(""), [(r.config.request_rate, r.outputs, r.metrics) for r in results]):
            print(f"saved {png}")
    return path


def main(argv: list[str]) -> None:
    """Entry point of `pdserve bench`."""
    args = parser().parse_args(argv)
    try:
        parse_rates(args.request_rate)
        parse_goodput(args.goodput)
    except ValueError as e:
        raise SystemExit(f"pdserve bench: {e}")
    doc = asyncio.run(bench(args))
    if args.save_result:
        save(args, doc)
    else:
        doc.pop("_results")
        if args.save_detailed:
            print("note: --save-detailed has no effect without --save-result")
