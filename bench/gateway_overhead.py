"""How much latency the gateway adds to each token: fake workers that emit a token per stream every
--interval-ms, the real gateway in front, `pdserve bench`'s engine as the client (all on this host).

Two measures per run, over the decode tokens of every stream:
- ITL minus the fake engine's interval (what the issue names; a constant delay cancels out in it);
- lateness: arrival time minus the tick the token was due at (the fake encodes the tick in the token
  id), i.e. the whole fake-worker -> gateway -> client path. The same client talking to the fake
  decode worker directly (no gateway) is the baseline; the gateway's share is the difference.

    python bench/gateway_overhead.py --streams 500 --errors-at 1000 --interval-ms 50
"""

from __future__ import annotations

import argparse
import json
import asyncio
import math
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from fake_stack import FakeStack  # noqa: E402

from pdserve.bench import datasets, report  # noqa: E402
from pdserve.bench.datasets import BenchRequest  # noqa: E402
from pdserve.bench.metrics import RequestOutput  # noqa: E402
from pdserve.bench.runner import RunConfig, run  # noqa: E402
from pdserve.client import AsyncClient, build_request  # noqa: E402
from pdserve.proto import worker_pb2, worker_pb2_grpc  # noqa: E402
from pdserve.serving import GRPC_OPTIONS  # noqa: E402

VOCAB = 49152  # fake_workers' default: token id = tick % VOCAB


class Timed:
    """Shared bookkeeping: ITL as `pdserve bench` measures it, plus the lateness of each decode token."""

    def __init__(self, interval: float, slots: int = 1) -> None:
        self.interval, self.period = interval, interval / slots  # token ids count ticks of period
        self.lateness: list[tuple[float, float]] = []  # (arrival, seconds late)
        self.spans: list[tuple[float, float]] = []  # (first token arrival, end) per stream
        self.gaps: list[tuple[float, float]] = []  # (arrival, gap) between two decode tokens

    def reset(self) -> None:
        self.lateness, self.spans, self.gaps = [], [], []

    def late(self, arrival: float, token: int) -> float:
        base = math.floor(arrival / self.period)
        k = base - ((base - token) % VOCAB)
        return arrival - k * self.period

    def chunk(self, out: RequestOutput, ids: list[int], now: float, last: float) -> None:
        if out.ttft == 0.0:
            out.ttft = now - out.start
        else:
            if out.itl:
                self.gaps.append((now, now - last))
            out.itl.append(now - last)
            self.lateness.append((now, self.late(now, ids[-1])))

    def done(self, out: RequestOutput, n: int) -> RequestOutput:
        out.latency = time.monotonic() - out.start
        out.output_len, out.success = n, n > 0
        self.spans.append((out.start + out.ttft, out.start + out.latency))
        return out


class ViaGateway(Timed):
    """The client as `pdserve bench` runs it, through the real gateway."""

    def __init__(self, address: str, interval: float, slots: int = 1) -> None:
        super().__init__(interval, slots)
        self.client = AsyncClient(address)

    async def send(self, req: BenchRequest) -> RequestOutput:
        out, n = RequestOutput(prompt_len=req.prompt_len), 0
        out.start = last = time.monotonic()
        request = build_request(token_ids=req.prompt_ids, max_tokens=req.output_len, temperature=0.0, ignore_eos=True)
        try:
            async for msg in self.client.stream(request):
                now = time.monotonic()
                if msg.HasField("chunk") and msg.chunk.token_ids:
                    self.chunk(out, list(msg.chunk.token_ids), now, last)
                    n, last = n + len(msg.chunk.token_ids), now
        except grpc.aio.AioRpcError as e:
            out.error = f"{e.code().name}: {e.details()}"
            return out
        return self.done(out, n)

    async def max_model_len(self) -> int | None:
        return None

    async def close(self) -> None:
        await self.client.close()


class Direct(Timed):
    """Baseline: the same client does the gateway's Reserve, Prefill, Decode calls itself."""

    def __init__(self, prefill: str, decode: str, interval: float, slots: int = 1) -> None:
        super().__init__(interval, slots)
        self.channels = [grpc.aio.insecure_channel(a, options=GRPC_OPTIONS) for a in (prefill, decode)]
        self.prefill = worker_pb2_grpc.PrefillWorkerStub(self.channels[0])
        self.decode = worker_pb2_grpc.DecodeWorkerStub(self.channels[1])

    async def send(self, req: BenchRequest) -> RequestOutput:
        out, rid = RequestOutput(prompt_len=req.prompt_len), uuid.uuid4().hex
        sampling = worker_pb2.WorkerSampling(max_tokens=req.output_len, ignore_eos=True, top_p=1.0, top_k=-1)
        out.start = time.monotonic()
        try:
            target = await self.decode.Reserve(worker_pb2.ReserveRequest(request_id=rid, num_tokens=req.prompt_len))
            first = await self.prefill.Prefill(worker_pb2.PrefillRequest(
                request_id=rid, prompt_token_ids=req.prompt_ids, sampling=sampling, target=target))
            last = time.monotonic()
            self.chunk(out, [first.first_token], last, last)
            n = 1
            async for batch in self.decode.Decode(worker_pb2.DecodeRequest(
                    request_id=rid, prompt_token_ids=req.prompt_ids, first_token=first.first_token, sampling=sampling)):
                now = time.monotonic()
                self.chunk(out, list(batch.token_ids), now, last)
                n, last = n + len(batch.token_ids), now
        except grpc.aio.AioRpcError as e:
            out.error = f"{e.code().name}: {e.details()}"
            return out
        return self.done(out, n)

    async def max_model_len(self) -> int | None:
        return None

    async def close(self) -> None:
        for ch in self.channels:
            await ch.close()


def _pct(xs: list[float]) -> dict[str, float]:
    """median / p90 / p99 / mean in milliseconds."""
    a = np.asarray(xs or [0.0]) * 1000.0
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "count": len(xs)}


async def measure(backend: Timed, streams: int, output_len: int, input_len: int) -> dict[str, Any]:
    """streams concurrent requests started at once; ITL and lateness statistics (ms) and errors."""
    reqs = datasets.random_requests(streams, input_len, output_len, 0.0, 32000, seed=streams)
    warm = datasets.random_requests(20, input_len, 5, 0.0, 32000, seed=1)
    await run(backend, warm, RunConfig(math.inf, progress=False))  # type: ignore[arg-type]
    backend.reset()
    res = await run(backend, reqs, RunConfig(math.inf, max_concurrency=streams, progress=False))  # type: ignore[arg-type]
    await backend.close()
    ok = [o for o in res.outputs if o.success]
    # steady state: every stream has its first token and none has finished
    lo = max((s for s, _ in backend.spans), default=0.0)
    hi = min((e for _, e in backend.spans), default=0.0)
    steady = [d for t, d in backend.lateness if lo <= t <= hi]
    steady_gaps = [g - backend.interval for t, g in backend.gaps if lo <= t <= hi]
    errors = [o.error for o in res.outputs if not o.success]
    return {
        "streams": streams, "output_len": output_len, "completed": len(ok), "errors": len(errors),
        "error_samples": sorted(set(errors))[:5], "duration_s": res.metrics["duration"],
        "tokens_per_s": res.metrics["output_throughput"],
        "ttft_ms": _pct([o.ttft for o in ok]),
        "itl_minus_interval_ms": _pct([g - backend.interval for o in ok for g in o.itl]),
        "itl_minus_interval_steady_ms": _pct(steady_gaps),
        "lateness_ms": _pct([d for _, d in backend.lateness]),
        "lateness_steady_ms": _pct(steady), "steady_window_s": max(0.0, hi - lo),
    }


async def experiment(args: argparse.Namespace, stack: FakeStack) -> dict[str, Any]:
    """Baseline (direct) and gateway runs at --streams, then the gateway at --errors-at."""
    interval = args.interval_ms / 1000.0
    w = stack.workers
    direct = await measure(Direct(w["fake-prefill"], w["fake-decode"], interval, args.slots), args.streams,
                           args.output_len, args.input_len)
    gateway = await measure(ViaGateway(stack.gateway, interval, args.slots), args.streams, args.output_len, args.input_len)
    big = (await measure(ViaGateway(stack.gateway, interval, args.slots), args.errors_at, args.output_len, args.input_len)
           if args.errors_at else {"errors": None})
    added = {k: gateway["lateness_steady_ms"][k] - direct["lateness_steady_ms"][k] for k in ("median", "p99")}
    return {"direct": direct, "gateway": gateway, f"gateway_{args.errors_at}": big,
            "gateway_added_per_token_ms": {
                "itl_minus_interval_steady": {k: gateway["itl_minus_interval_steady_ms"][k] for k in ("median", "p99")},
                "lateness_vs_direct": added},
            "target": {"median_ms": 1.0, "p99_ms": 5.0, "errors_at": args.errors_at},
            "met": {"median": max(added["median"], gateway["itl_minus_interval_steady_ms"]["median"]) <= 1.0,
                    "p99": max(added["p99"], gateway["itl_minus_interval_steady_ms"]["p99"]) <= 5.0,
                    "no_errors": big["errors"] == 0 if args.errors_at else None}}


def main() -> None:
    p = argparse.ArgumentParser(description="gateway per-token overhead against fake workers (CPU)")
    p.add_argument("--streams", type=int, default=500)
    p.add_argument("--errors-at", type=int, default=1000)
    p.add_argument("--interval-ms", type=float, default=50.0)
    p.add_argument("--slots", type=int, default=1, help="fake decode: spread streams over N tick phases")
    p.add_argument("--output-len", type=int, default=200)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--out", default=None, help="default bench/results/gateway-overhead-cpu-<date>.json")
    args = p.parse_args()
    with FakeStack(interval_ms=args.interval_ms, slots=args.slots) as stack:
        doc = asyncio.run(experiment(args, stack))
        doc["log_tails"] = {name: proc.lines[-10:] for name, proc in stack.procs.items()}
    head = {"date": time.strftime("%Y-%m-%d"), "commit": _commit(), "cpus": os.cpu_count(),
            "interval_ms": args.interval_ms, "slots": args.slots, "streams": args.streams, "note": "CPU-only: fake workers, real gateway and client share this host"}
    doc = {**head, **doc}
    out = Path(args.out or Path(__file__).parent / "results" / f"gateway-overhead-cpu-{head['date']}.json")
    report.save_json(out, doc)
    print(json.dumps({k: doc[k] for k in ("gateway_added_per_token_ms", "met")}, indent=1))
    print(f"saved {out}")


def _commit() -> str:
    import subprocess

    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    return r.stdout.strip()


if __name__ == "__main__":
    main()
