"""Host time of one decode step on CPU, as bench/engine.py's cpu_overhead measures it on the GPU.

python bench/step_overhead.py [--batches 1,32,256] [--steps 50]

schedule() + runner.check() + the CUDA-graph input staging (DecodeGraphs.stage, built with
capture=False so it runs here: the same host code as on CUDA, less the pinned H2D copy) +
update(), with 1024-token prompts and a tiny model (the host path does not depend on its size).
Prints the median milliseconds per step at each batch size. CPU timings do not prove GPU ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Sequence, SeqStatus
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.core.step_io import StepOutput
from pdserve.model.spec import ModelSpec
from pdserve.runtime.cuda_graph import DecodeGraphs
from pdserve.runtime.runner import ModelRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20)
BS = 16
CTX = 1024
MAX_MODEL_LEN = 8192 + 512  # as bench/engine.py: graph tables 544 blocks wide


def tiny_runner(num_blocks: int) -> ModelRunner:
    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
        max_position_embeddings=MAX_MODEL_LEN,
    ))
    r = ModelRunner(spec, None, num_blocks=num_blocks, block_size=BS, load_format="dummy",
                    max_model_len=MAX_MODEL_LEN, max_num_seqs=256)
    # What a CUDA runner holds: graphs, here without capture (stage() is the host side).
    r.graphs = DecodeGraphs(r.model, r.kv_pool, block_size=BS, max_model_len=r.max_model_len,
                            max_num_seqs=256, capture=False)
    return r


def step_ms(runner: ModelRunner, batch: int, steps: int) -> float:
    """Median host ms of one decode step of `batch` running sequences (engine.cpu_overhead)."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=256, max_model_len=4096), BlockManager(runner.num_blocks, BS))
    for i in range(batch):
        blocks = sched.blocks.allocate(CTX // BS + 1)
        sched.add(Sequence(f"s{i}", list(range(CTX)), GREEDY, output_ids=[7], block_table=blocks,
                           num_computed=CTX, status=SeqStatus.RUNNING))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step = sched.schedule()
        runner.check(step)
        if runner.graphed(step):
            runner.graphs.stage(step.seqs)
        else:
            runner._prepare(step.seqs)
        sched.update(step, StepOutput({s.request_id: 7 for s in step.seqs}))
        times.append(time.perf_counter() - t0)
    assert runner.graphed(step)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    runner = tiny_runner(max(batches) * (CTX // BS + 1 + args.steps // BS + 2) + 64)
    with torch.inference_mode():
        for b in batches:
            print(f"bs{b}: {step_ms(runner, b, args.steps):.3f} ms/step (median of {args.steps})")


if __name__ == "__main__":
    main()
