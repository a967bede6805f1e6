"""Logit biases, then presence, frequency and repetition penalties, on the logits of a step's
sampled rows (`process`).

OpenAI's presence and frequency penalties count the tokens generated so far (logit -=
presence * [count > 0] + frequency * count); the repetition penalty (vLLM's, Hugging Face's)
covers the prompt's tokens as well: such a token's logit is divided by it when positive and
multiplied by it otherwise. The counts are built on the device from each penalized slice's
`history` and own tokens, plus, for a placeholder slice (overlapped steps), the token the
previous step sampled (read on the device, no sync). Repetition first, then the others, as vLLM.
OpenAI's logit_bias is added to each listed token's logit before the penalties.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pdserve.core.step_io import SeqSlice
from pdserve.runtime.sampler import to_device


def process(logits: torch.Tensor, slices: Sequence[SeqSlice], prev_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] of the sampled slices with each row's logit_bias added, then its penalties
    applied (`penalize`): a new tensor, or `logits` itself when no slice has either."""
    rows = [b for b, s in enumerate(slices) if s.sampling.logit_bias]
    if rows:
        r = [b for b in rows for _ in slices[b].sampling.logit_bias]
        cols = [t for b in rows for t, _ in slices[b].sampling.logit_bias]
        biases = [v for b in rows for _, v in slices[b].sampling.logit_bias]
        dev = logits.device
        logits = logits.clone()
        logits.index_put_((to_device(r, dev), to_device(cols, dev)), to_device(biases, dev, logits.dtype),
                          accumulate=True)
    return penalize(logits, slices, prev_tokens)


def penalize(logits: torch.Tensor, slices: Sequence[SeqSlice], prev_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] of the sampled slices (row b: slices[b]) with their penalties applied: a
    new tensor, or `logits` itself when no slice is penalized. prev_tokens: the previous step's
    sampled tokens, which placeholder slices (prev_row >= 0) read."""
    rows = [b for b, s in enumerate(slices) if s.sampling.penalized]
    if not rows:
        return logits
    prompt: tuple[list[int], list[int]] = ([], [])  # (row, token) pairs
    output: tuple[list[int], list[int]] = ([], [])
    placeholders: tuple[list[int], list[int]] = ([], [])  # (row, previous step's row)
    for i, b in enumerate(rows):
        s = slices[b]
        if s.prev_row >= 0:
            if prev_tokens is None:
                raise ValueError(f"{s.request_id}: a placeholder slice needs the previous step's tokens")
            placeholders[0].append(i)
            placeholders[1].append(s.prev_row)
            tokens: Sequence[int] = s.history
        else:
            tokens = s.history + s.token_ids
        p = max(0, min(s.prompt_len, len(tokens)))
        prompt[0].extend([i] * p)
        prompt[1].extend(tokens[:p])
        output[0].extend([i] * (len(tokens) - p))
        output[1].extend(tokens[p:])
    dev, n, vocab = logits.device, len(rows), logits.shape[1]
    counts = torch.zeros((n, vocab), dtype=torch.float32, device=dev)
    one = torch.ones((), dtype=torch.float32, device=dev)
    if output[0]:
        counts.index_put_((to_device(output[0], dev), to_device(output[1], dev)), one, accumulate=True)
    if placeholders[0]:
        last = prev_tokens[to_device(placeholders[1], dev)].long()  # type: ignore[index]
        counts.index_put_((to_device(placeholders[0], dev), last), one, accumulate=True)
    seen = counts > 0
    if prompt[0]:
        seen.index_put_((to_device(prompt[0], dev), to_device(prompt[1], dev)), torch.ones((), dtype=torch.bool, device=dev))
    params = [slices[b].sampling for b in rows]
    rep, freq, pres = (to_device([getattr(p, f) for p in params], dev, torch.float32)[:, None]
                       for f in ("repetition_penalty", "frequency_penalty", "presence_penalty"))
    index = to_device(rows, dev)
    x = logits.index_select(0, index).float()
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - freq * counts - pres * (counts > 0)
    out = logits.clone()
    out.index_copy_(0, index, x.to(logits.dtype))
    return out
