"""Console table, JSON result and PNG plots of benchmark runs."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pdserve.bench.metrics import METRICS, PERCENTILES, RequestOutput

TITLES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
          "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}


def table(m: Mapping[str, Any], request_rate: float, max_concurrency: int | None) -> str:
    """The result of one run as a vLLM-style console table."""
    rows: list[tuple[str, Any]] = [
        ("Request rate (req/s)", "inf" if math.isinf(request_rate) else request_rate),
        ("Maximum request concurrency", max_concurrency or "none"),
        ("Successful requests", m["completed"]), ("Failed requests", m["failed"]),
        ("Benchmark duration (s)", m["duration"]),
        ("Total input tokens", m["total_input_tokens"]), ("Total generated tokens", m["total_output_tokens"]),
        ("Request throughput (req/s)", m["request_throughput"]),
    ]
    if "request_goodput" in m:
        rows.append(("Request goodput (req/s)", m["request_goodput"]))
    rows += [("Output token throughput (tok/s)", m["output_throughput"]),
             ("Total token throughput (tok/s)", m["total_token_throughput"])]
    lines = [f"{' Serving Benchmark Result ':=^56}"] + [_row(k, v) for k, v in rows]
    for name in METRICS:
        lines.append(f"{' ' + TITLES[name] + ' ':-^56}")
        lines += [_row(f"Mean {name.upper()} (ms)", m[f"mean_{name}_ms"]),
                  _row(f"Median {name.upper()} (ms)", m[f"median_{name}_ms"])]
        lines += [_row(f"P{p} {name.upper()} (ms)", m[f"p{p}_{name}_ms"]) for p in PERCENTILES if p != 50]
    lines.append("=" * 56)
    return "\n".join(lines)


def _row(label: str, value: Any) -> str:
    return f"{label + ':':<42}{value:>14.2f}" if isinstance(value, float) else f"{label + ':':<42}{value!s:>14}"


def save_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Writes doc as JSON (infinite rates become the string "inf")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(doc), indent=2) + "\n")


def _finite(x: Any) -> Any:
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if isinstance(x, Mapping):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def plot(prefix: Path, runs: Sequence[tuple[float, Sequence[RequestOutput], Mapping[str, Any]]]) -> list[Path]:
    """Latency CDFs per run, and goodput (or throughput) against request rate for several rates.

    Returns the PNGs written; prints a note and writes nothing when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; skipping plots (pip install matplotlib)")
        return []
    prefix.parent.mkdir(parents=True, exist_ok=True)
    written = [_cdfs(plt, Path(f"{prefix}-cdf.png"), runs)]
    if len(runs) > 1:
        written.append(_vs_rate(plt, Path(f"{prefix}-goodput.png"), runs))
    return written


def _cdfs(plt: Any, path: Path, runs: Sequence[tuple[float, Sequence[RequestOutput], Mapping[str, Any]]]) -> Path:
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for ax, name in zip(axes, METRICS):
        for rate, outs, _ in runs:
            ok = [o for o in outs if o.success]
            vals = {"ttft": [o.ttft for o in ok], "tpot": [o.tpot for o in ok if o.output_len > 1],
                    "itl": [g for o in ok for g in o.itl], "e2el": [o.latency for o in ok]}[name]
            xs = sorted(v * 1000.0 for v in vals)
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"rate {rate:g}")
        ax.set_title(TITLES[name], fontsize=9)
        ax.set_xlabel("ms")
        ax.set_ylabel("CDF")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _vs_rate(plt: Any, path: Path, runs: Sequence[tuple[float, Sequence[RequestOutput], Mapping[str, Any]]]) -> Path:
    key = "request_goodput" if "request_goodput" in runs[0][2] else "request_throughput"
    finite = [(r, m[key]) for r, _, m in runs if not math.isinf(r)]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot([r for r, _ in finite], [g for _, g in finite], marker="o")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel(f"{key.replace('_', ' ')} (req/s)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
