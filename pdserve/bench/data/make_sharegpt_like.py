"""Writes sharegpt_like.json: a SYNTHETIC (input_len, output_len) mix that resembles ShareGPT.

No ShareGPT conversation is used. Lengths are drawn with a fixed seed from log-normal
distributions whose shape was chosen to resemble what is published about ShareGPT V3 with a
Llama-style tokenizer (heavy right tails; inputs mostly short with a long tail, outputs a few
hundred tokens) and then filtered the way `vllm bench serve` filters ShareGPT (each length >= 4,
input <= 1024, input + output <= 2048). Run: python pdserve/bench/data/make_sharegpt_like.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SEED = 20261202
COUNT = 1000
INPUT = {"median": 90.0, "sigma": 1.25}   # log-normal: exp(N(log median, sigma))
OUTPUT = {"median": 190.0, "sigma": 0.95}


def draw(count: int = COUNT, seed: int = SEED) -> list[tuple[int, int]]:
    """count pairs that pass vLLM's ShareGPT filter, drawn with a fixed seed."""
    rng = np.random.default_rng(seed)
    pairs: list[tuple[int, int]] = []
    while len(pairs) < count:
        i = int(rng.lognormal(np.log(INPUT["median"]), INPUT["sigma"]))
        o = int(rng.lognormal(np.log(OUTPUT["median"]), OUTPUT["sigma"]))
        if i >= 4 and o >= 4 and i <= 1024 and i + o <= 2048:
            pairs.append((i, o))
    return pairs


def main() -> None:
    """Write the JSON next to this script and print its summary statistics."""
    pairs = draw()
    ins, outs = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    doc = {
        "description": "SYNTHETIC length mix resembling ShareGPT (not ShareGPT data): log-normal input and "
                       "output lengths with a fixed seed, filtered as vllm bench serve filters ShareGPT.",
        "generator": "pdserve/bench/data/make_sharegpt_like.py",
        "seed": SEED, "input": INPUT, "output": OUTPUT,
        "stats": {"input_mean": round(float(ins.mean()), 1), "input_median": float(np.median(ins)),
                  "output_mean": round(float(outs.mean()), 1), "output_median": float(np.median(outs))},
        "pairs": pairs,
    }
    out = Path(__file__).with_name("sharegpt_like.json")
    out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(out, doc["stats"])


if __name__ == "__main__":
    main()
