"""How often a prefill forward waits for Triton to compile, and which arguments cause it.

Triton specializes every launch on its integer arguments (equal to 1, divisible by 16) and on
pointer alignment, and compiles each new combination the first time it is seen. A prefill
batch's token count, sequence count and block-table width vary from step to step, so a fresh
worker can meet new combinations long after start-up. This runs random prefill batches shaped
like the serving benchmark's (1-8 prompts of 256-768 tokens, some behind a cached prefix)
through a ModelRunner and reports, per call, its wall time and how many kernels it compiled,
then which arguments the compiled variants of each kernel differ in.

python bench/jit_variants.py --out FILE [--config bench/configs/llama-3.1-8b.json] [--layers 2]
    [--calls 60] [--warm]   # --warm: ModelRunner.warm_up() first, timed
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import random
import statistics
import time
from pathlib import Path

import torch
from triton.runtime.jit import JITFunction

from pdserve.bench.provenance import source_commit
from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import SeqSlice, StepInput
from pdserve.kernels._common import launchable_kernels
from pdserve.model.spec import ModelSpec
from pdserve.runtime.runner import ModelRunner

BS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def cache_keys(fn: JITFunction) -> list:
    """The compiled variants of this function over all devices (one key each)."""
    keys = []
    for caches in list(fn.device_caches.values()):
        keys.extend(caches[0].keys())
    return keys


def _spec_list(key) -> list | None:
    """The specialization entries of a kernel-cache key: str(list of tuples) + str(options)."""
    text = key if isinstance(key, str) else str(key)
    depth, quote = 0, ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth == 0:
                try:
                    return list(ast.literal_eval(text[:i + 1]))
                except (ValueError, SyntaxError):
                    return None
    return None


def compiled(fns: dict[str, JITFunction]) -> int:
    return sum(len(cache_keys(f)) for f in fns.values())


def varying_args(fn: JITFunction) -> list[str]:
    """Names of the arguments whose specialization differs between the compiled variants."""
    specs = [_spec_list(k) for k in cache_keys(fn)]
    if len(specs) < 2 or any(s is None for s in specs):
        return [] if len(specs) < 2 else ["(keys not parsed)"]
    names = [p.name for p in fn.params]
    return [name for i, name in enumerate(names)
            if len({str(s[i]) if i < len(s) else "" for s in specs}) > 1]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_batch(rng: random.Random, next_block: list[int], num_blocks: int, vocab: int,
                 max_prompts: int) -> StepInput:
    """1..max_prompts prompts of 256-768 tokens; a third start behind a cached prefix."""
    seqs = []
    for i in range(rng.randint(1, max_prompts)):
        n = rng.randint(256, 768)
        start = rng.randrange(0, n // 2, BS) if rng.random() < 1 / 3 else 0
        need = -(-n // BS)
        if next_block[0] + need > num_blocks:
            next_block[0] = 0
        table = tuple(range(next_block[0], next_block[0] + need))
        next_block[0] += need
        ids = tuple(rng.randrange(vocab) for _ in range(n - start))
        seqs.append(SeqSlice(f"r{i}", ids, start, table, GREEDY))
    return StepInput(tuple(seqs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--config", default=str(Path(__file__).parent / "configs" / "llama-3.1-8b.json"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--max-prompts", type=int, default=8)
    p.add_argument("--warm", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")  # cpu: a smoke run of the script (nothing compiles)
    args = p.parse_args()
    cfg = json.loads(Path(args.config).read_text())
    cfg["num_hidden_layers"] = args.layers
    spec = ModelSpec.from_config_dict(cfg)
    num_blocks = 4096
    runner = ModelRunner(spec, None, device=args.device, dtype=torch.bfloat16, num_blocks=num_blocks,
                         block_size=BS, load_format="dummy", max_model_len=8192, max_num_seqs=64)
    fns: dict[str, JITFunction] = launchable_kernels()  # type: ignore[assignment]
    base = compiled(fns)  # the decode graphs' captures compiled these
    result: dict = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "date": datetime.date.today().isoformat(),
                    "commit": source_commit(), "config": Path(args.config).name, "layers": args.layers,
                    "compiled_at_start": base, "warm": args.warm}
    if args.warm:
        t0 = time.perf_counter()
        runner.warm_up()
        result["warm_up_s"] = time.perf_counter() - t0
        result["compiled_by_warm_up"] = compiled(fns) - base
    rng = random.Random(args.seed)
    next_block = [0]
    calls = []
    for _ in range(args.calls):
        step = random_batch(rng, next_block, num_blocks, spec.vocab_size, args.max_prompts)
        before = compiled(fns)
        sync()
        t0 = time.perf_counter()
        runner.execute(step)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        calls.append({"prompts": len(step.seqs), "tokens": step.num_tokens, "ms": ms,
                      "compiled": compiled(fns) - before})
        print(f"{len(step.seqs)} prompts {step.num_tokens:5d} tokens {ms:9.1f} ms  "
              f"compiled {calls[-1]['compiled']}", flush=True)
    quiet = [c["ms"] for c in calls if c["compiled"] == 0]
    noisy = [c["ms"] for c in calls if c["compiled"]]
    ms = sorted(c["ms"] for c in calls)
    result.update({
        "calls": calls,
        "calls_that_compiled": len(noisy),
        "kernels_compiled_during_calls": sum(c["compiled"] for c in calls),
        "ms_p50": statistics.median(ms), "ms_p90": ms[int(0.9 * (len(ms) - 1))], "ms_max": ms[-1],
        "ms_p50_without_compiles": statistics.median(quiet) if quiet else None,
        "ms_mean_with_compiles": statistics.mean(noisy) if noisy else None,
        "variants": {name: {"count": len(cache_keys(f)), "differ_in": varying_args(f)}
                     for name, f in fns.items() if cache_keys(f)},
    })
    print(json.dumps({k: v for k, v in result.items() if k != "calls"}, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
