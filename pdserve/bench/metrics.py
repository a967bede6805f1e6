"""Per-request timings and the aggregate metrics of `vllm bench serve`.

Definitions (as vLLM's benchmark_serving computes them):
- TTFT: request start to the first streamed chunk with tokens.
- TPOT: (E2EL - TTFT) / (output_tokens - 1), per request with more than one output token.
- ITL: every gap between consecutive streamed chunks, pooled over all requests.
- E2EL: request start to the end of the stream.
- goodput: successful requests meeting every given SLO, per second of benchmark duration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_NAMES = ("ttft", "tpot", "e2el")


@dataclass
class RequestOutput:
    """What one request measured (seconds, perf_counter clock)."""

    success: bool = False
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0
    error: str = ""

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first; 0 for one-token outputs (as vLLM's goodput)."""
        return (self.latency - self.ttft) / (self.output_len - 1) if self.output_len > 1 else 0.0


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """['ttft:200', 'tpot:30'] -> {'ttft': 200.0, 'tpot': 30.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_NAMES:
            raise ValueError(f"--goodput: expected NAME:MS with NAME in {SLO_NAMES}, got {item!r}")
        ms = float(value)
        if ms < 0:
            raise ValueError(f"--goodput: {name} must be >= 0 ms, got {ms}")
        slos[name] = ms
    return slos


def meets_slos(out: RequestOutput, slos_ms: Mapping[str, float]) -> bool:
    """True when a successful request is within every SLO (inclusive, like vLLM)."""
    values = {"ttft": out.ttft, "tpot": out.tpot, "e2el": out.latency}
    return out.success and all(values[k] * 1000.0 <= v for k, v in slos_ms.items())


def _stats(name: str, seconds: Sequence[float]) -> dict[str, float]:
    """mean/median/std/pXX of a list of seconds, in milliseconds (zeros when empty, as vLLM)."""
    ms = np.asarray(seconds, dtype=float) * 1000.0 if len(seconds) else np.zeros(1)
    out = {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
           f"std_{name}_ms": float(ms.std())}
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def compute(outputs: Sequence[RequestOutput], duration: float,
            slos_ms: Mapping[str, float] | None = None) -> dict[str, float]:
    """The aggregate metrics of one benchmark run that lasted duration seconds."""
    ok = [o for o in outputs if o.success]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_len for o in ok)
    res: dict[str, float] = {
        "duration": duration, "completed": len(ok), "failed": len(outputs) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    if slos_ms:
        res["request_goodput"] = sum(meets_slos(o, slos_ms) for o in ok) / duration
    samples = {
        "ttft": [o.ttft for o in ok],
        "tpot": [o.tpot for o in ok if o.output_len > 1],
        "itl": [g for o in ok for g in o.itl],
        "e2el": [o.latency for o in ok],
    }
    for name in METRICS:
        res.update(_stats(name, samples[name]))
    return res


def detailed(outputs: Sequence[RequestOutput]) -> list[dict[str, object]]:
    """Per-request records (milliseconds) for --save-detailed."""
    t0 = min((o.start for o in outputs), default=0.0)
    return [{"success": o.success, "prompt_len": o.prompt_len, "output_len": o.output_len,
             "start_ms": (o.start - t0) * 1000.0, "ttft_ms": o.ttft * 1000.0, "tpot_ms": o.tpot * 1000.0,
             "e2el_ms": o.latency * 1000.0, "itl_ms": [g * 1000.0 for g in o.itl], "error": o.error}
            for o in outputs]
