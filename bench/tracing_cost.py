"""What tracing costs the engine loop: decode steps bare, through EngineLoop with tracing off,
and with tracing on (an SDK provider with a batch processor and an exporter that drops spans).

Used by bench/engine.py (GPU, per model) and runnable alone on any device:
python bench/tracing_cost.py [--batch 32] [--steps 40]   (tiny random model on CPU)

"bare" is schedule -> runner.execute -> update with no loop; "off" is EngineLoop._step, the
step body the workers run, with `step_tracer = None`; "on" adds a StepTracer whose requests
carry a sampled span context, so every step records a forward span with links. Rounds are
interleaved (bare, off, on, bare, ...) so drift hits all three alike; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Sequence as Seq
from pdserve.core.request import SeqStatus
from pdserve.core.sampling import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.runtime.loop import EngineLoop
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.step_trace import StepTracer

GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20)


class CountingExporter(SpanExporter):
    """Drops spans, counting them (so a run can show that tracing really recorded)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _loop(runner: ModelRunner, batch: int, ctx: int, step_tracer: StepTracer | None = None) -> EngineLoop:
    """An EngineLoop (thread not started) over `batch` running sequences of `ctx` cached tokens,
    submitted in the caller's span context."""
    bs = runner.block_size
    sched = Scheduler(SchedulerConfig(max_num_seqs=batch, max_model_len=ctx + 1024),
                      BlockManager(runner.num_blocks, bs))
    loop = EngineLoop(sched, runner)
    loop.step_tracer = step_tracer
    for i in range(batch):
        blocks = sched.blocks.allocate(ctx // bs + 1)
        seq = Seq(f"s{i}", [t % 100 for t in range(ctx)], GREEDY, output_ids=[7], block_table=blocks,
                  num_computed=ctx, status=SeqStatus.RUNNING)
        loop.submit(seq, lambda ev: None)
    return loop


def _sync(runner: ModelRunner) -> None:
    if runner.device.type == "cuda":
        torch.cuda.synchronize()


def tracing_cost(runner: ModelRunner, batch: int = 32, ctx: int = 512, steps: int = 40) -> dict:
    """Median ms per decode step bare / loop with tracing off / loop with tracing on, and ratios."""
    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    root = tracer.start_span("bench.request")
    loops = {"bare": _loop(runner, batch, ctx), "off": _loop(runner, batch, ctx)}
    with trace.use_span(root):
        loops["on"] = _loop(runner, batch, ctx, StepTracer("decode", tracer=tracer))

    def bare() -> None:
        sched = loops["bare"].scheduler
        step = sched.schedule()
        sched.update(step, runner.execute(step))

    def looped(mode: str) -> Callable[[], None]:
        loop = loops[mode]
        return lambda: loop._step(loop.scheduler.schedule())

    fns = {"bare": bare, "off": looped("off"), "on": looped("on")}
    times: dict[str, list[float]] = {m: [] for m in fns}
    for i in range(steps + 3):
        for mode, fn in fns.items():
            _sync(runner)
            t0 = time.perf_counter()
            fn()
            _sync(runner)
            if i >= 3:  # warm-up steps
                times[mode].append(time.perf_counter() - t0)
    root.end()
    provider.force_flush()
    provider.shutdown()
    ms = {m: statistics.median(t) * 1e3 for m, t in times.items()}
    return {"batch": batch, "context": ctx, "steps": steps, "bare_step_ms": ms["bare"],
            "off_step_ms": ms["off"], "on_step_ms": ms["on"],
            "off_over_bare": ms["off"] / ms["bare"], "on_over_bare": ms["on"] / ms["bare"],
            "spans_exported": exporter.spans}


def main() -> None:
    from pdserve.model.spec import ModelSpec

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=40)
    a = p.parse_args()
    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096))
    blocks = 3 * a.batch * ((a.context + 1024) // 16 + 1)
    runner = ModelRunner(spec, None, num_blocks=blocks, block_size=16, load_format="dummy",
                         max_model_len=a.context + 1024, max_num_seqs=a.batch)
    print(json.dumps(tracing_cost(runner, a.batch, a.context, a.steps), indent=1))


if __name__ == "__main__":
    main()
