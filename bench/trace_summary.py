"""Where a request's time went: span durations by name from a PDSERVE_TRACE_FILE (JSON lines).

python bench/trace_summary.py traces.jsonl     prints count, p50, p90, max (ms) per span name
Used by bench/serve_matrix.py --trace to put a per-mode breakdown into its JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list."""
    return xs[min(len(xs) - 1, max(0, round(q * len(xs) + 0.5) - 1))]


def summarise(path: Path) -> dict[str, dict[str, float]]:
    """{span name: {count, p50_ms, p90_ms, max_ms}}; lines that are not spans are skipped."""
    by_name: dict[str, list[float]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            span = json.loads(line)
            ms = (span["end_ns"] - span["start_ns"]) / 1e6
        except (ValueError, KeyError, TypeError):
            continue  # a torn line (several processes append to one file)
        by_name.setdefault(span["name"], []).append(ms)
    out = {}
    for name, xs in sorted(by_name.items()):
        xs.sort()
        out[name] = {"count": len(xs), "p50_ms": _pct(xs, 0.5), "p90_ms": _pct(xs, 0.9), "max_ms": xs[-1]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file")
    a = p.parse_args()
    rows = summarise(Path(a.file))
    print(f"{'span':<24} {'count':>6} {'p50 ms':>9} {'p90 ms':>9} {'max ms':>9}")
    for name, r in rows.items():
        print(f"{name:<24} {r['count']:>6} {r['p50_ms']:>9.2f} {r['p90_ms']:>9.2f} {r['max_ms']:>9.2f}")


if __name__ == "__main__":
    main()
