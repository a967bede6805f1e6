"""Plot decode throughput against batch size from a bench/engine.py JSON (needs matplotlib).

python bench/plot_engine.py bench/results/engine-h200-<date>.json [--out FILE.png]
One line per model (ours) and transformers generate() at batch 1 and 32 from the same run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json")
    p.add_argument("--out", default="")
    a = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(Path(a.json).read_text())
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, m) in enumerate(doc["models"].items()):
        color = f"C{i}"
        by_batch = m["decode_tok_s_by_batch"]
        xs = sorted(int(b) for b in by_batch)
        ax.plot(xs, [by_batch[str(b)] for b in xs], "o-", color=color, label=f"pdserve {name}")
        hf = {int(b): v for b, v in m.get("hf_generate_tok_s", {}).items() if isinstance(v, float)}
        if hf:
            ax.plot(sorted(hf), [hf[b] for b in sorted(hf)], "s--", color=color, alpha=0.6,
                    label=f"transformers generate() {name}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decode batch size (1k-token context)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"Decode throughput, {doc['gpu']}, {doc['date']}, commit {doc['commit'][:7]}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    out = a.out or str(Path(a.json).with_suffix(".png"))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
