"""Where a prompt's logprobs spend their time (GPU): the lm_head and the log-softmax / top-k / gather
of runtime.prompt_logprobs over a 2k-token prompt of Llama-3's 128k vocabulary, piece by piece,
beside candidate variants of the top-k. Prints JSON; --out FILE saves it.

    python3 bench/prompt_logprobs_probe.py --out bench/results/plp-probe-<gpu>-<date>.json
"""

from __future__ import annotations

import argparse
import json

import torch

from pdserve.bench.provenance import source_commit
from timing import event_ms


def two_stage_topk(x: torch.Tensor, k: int, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """topk of each row through the top k of each `chunk`-wide slice, then of those candidates."""
    r, v = x.shape
    pad = (-v) % chunk
    if pad:
        x = torch.nn.functional.pad(x, (0, pad), value=float("-inf"))
    vals, idx = x.view(r, -1, chunk).topk(k, dim=-1)
    idx = idx + torch.arange(0, v + pad, chunk, device=x.device).view(1, -1, 1)
    top, where = vals.reshape(r, -1).topk(k, dim=-1)
    return top, idx.reshape(r, -1).gather(1, where)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    hidden = torch.randn(a.tokens, a.hidden, device=dev, dtype=torch.bfloat16)
    w = torch.randn(a.vocab, a.hidden, device=dev, dtype=torch.bfloat16) * 0.02
    targets = torch.randint(0, a.vocab, (a.tokens,), device=dev)
    res: dict = {"gpu": torch.cuda.get_device_name(), "commit": source_commit(), "tokens": a.tokens,
                 "vocab": a.vocab, "k": a.k, "ms": {}}
    ms = res["ms"]
    for piece in (256, 1024):
        logits = hidden[:piece] @ w.T
        n = a.tokens / piece  # pieces per prompt
        ms[f"lm_head_x{piece}"] = event_ms(lambda: hidden[:piece] @ w.T) * n
        ms[f"float_x{piece}"] = event_ms(lambda: logits.float()) * n
        lf = logits.float()
        ms[f"log_softmax_x{piece}"] = event_ms(lambda: lf.log_softmax(-1)) * n
        lp = lf.log_softmax(-1)
        ms[f"topk_float_x{piece}"] = event_ms(lambda: lp.topk(a.k, dim=-1)) * n
        ms[f"topk_bf16_x{piece}"] = event_ms(lambda: logits.topk(a.k, dim=-1)) * n
        ms[f"topk_two_stage_x{piece}"] = event_ms(lambda: two_stage_topk(lp, a.k)) * n
        ms[f"logsumexp_x{piece}"] = event_ms(lambda: torch.logsumexp(lf, -1)) * n
        ms[f"gather_x{piece}"] = event_ms(lambda: lp.gather(1, targets[:piece, None])) * n

        def current() -> None:  # runtime.prompt_logprobs' piece: token_logprobs
            x = (hidden[:piece] @ w.T).float().log_softmax(-1)
            x.topk(a.k, dim=-1)
            x.gather(1, targets[:piece, None])

        def lse_variant() -> None:  # no log-softmax tensor: logits - logsumexp at the picks
            x = hidden[:piece] @ w.T
            lse = torch.logsumexp(x.float(), -1, keepdim=True)
            v, _ = two_stage_topk(x.float(), a.k)
            (v - lse, x.gather(1, targets[:piece, None]).float() - lse)

        def lse_bf16_topk() -> None:  # the top k of the bf16 logits (same order), minus the float lse
            x = hidden[:piece] @ w.T
            lse = torch.logsumexp(x.float(), -1, keepdim=True)
            v, _ = x.topk(a.k, dim=-1)
            (v.float() - lse, x.gather(1, targets[:piece, None]).float() - lse)

        ms[f"piece_current_x{piece}"] = event_ms(current) * n
        ms[f"piece_lse_bf16_topk_x{piece}"] = event_ms(lse_bf16_topk) * n
        ms[f"piece_lse_two_stage_x{piece}"] = event_ms(lse_variant) * n
        x = lp
        check = two_stage_topk(x, a.k)
        ref = x.topk(a.k, dim=-1)
        res[f"two_stage_equal_x{piece}"] = bool(torch.equal(check[0], ref[0]) and torch.equal(check[1], ref[1]))
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
