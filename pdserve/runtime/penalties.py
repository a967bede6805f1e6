"""Logit biases, then presence, frequency and repetition penalties, on the logits of a step's
sampled rows (`process`).

OpenAI's presence and frequency penalties count the tokens generated so far (logit -=
presence * [count > 0] + frequency * count); the repetition penalty (vLLM's, Hugging Face's)
covers the prompt's tokens as well: such a token's logit is divided by it when positive and
multiplied by it otherwise. Repetition first, then the others, as vLLM. OpenAI's logit_bias is
added to each listed token's logit before the penalties.

The counts live on the device between steps (`PenaltyCounts`, one row per request): a step
adds its slices' own tokens, a placeholder slice's (overlapped steps) read from the previous
step's tokens there, so a decode step uploads a token per request, not its history. A request
not seen before, or whose counted tokens do not end where its slice starts (recomputed after a
preemption, or its row given to another), is counted again from its slice's `history`.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from pdserve.core.step_io import SeqSlice
from pdserve.kernels import reference
from pdserve.runtime.sampler import to_device

# On CUDA the penalties are applied by one Triton pass (pdserve.kernels.penalties) rather than
# reference.apply_penalties' torch passes.
KERNEL_PENALTIES = True


class PenaltyCounts:
    """Per-request token counts on the device: how often each token was generated (`generated`,
    float32) and whether it is in the prompt (`in_prompt`, uint8), in `slots` rows (allocated on
    first use) reused least recently used first."""

    def __init__(self, vocab: int, device: str | torch.device, slots: int) -> None:
        self.vocab, self.device, self.slots = vocab, torch.device(device), slots
        self._counts: torch.Tensor | None = None  # [slots, V] float32
        self._prompt: torch.Tensor | None = None  # [slots, V] uint8
        self._where: OrderedDict[str, tuple[int, int]] = OrderedDict()  # request -> (row, positions counted)
        self._free = list(range(slots - 1, -1, -1))

    @staticmethod
    def nbytes(slots: int, vocab: int) -> int:
        """Device bytes the counts take once a penalized request comes (float32 + uint8 rows)."""
        return slots * vocab * 5

    @property
    def generated(self) -> torch.Tensor:
        assert self._counts is not None, "count() first"
        return self._counts

    @property
    def in_prompt(self) -> torch.Tensor:
        assert self._prompt is not None, "count() first"
        return self._prompt

    def count(self, slices: Sequence[SeqSlice], prev_tokens: torch.Tensor | None) -> torch.Tensor:
        """The rows (on the device) holding the slices' counts, every token before each one's
        sampled position counted (slices are penalized, at most `slots`, each request once)."""
        if len(slices) > self.slots:
            raise ValueError(f"{len(slices)} penalized slices in one step, room for {self.slots}")
        if self._counts is None:
            self._counts = torch.zeros((self.slots, self.vocab), dtype=torch.float32, device=self.device)
            self._prompt = torch.zeros((self.slots, self.vocab), dtype=torch.uint8, device=self.device)
        in_step = {s.request_id for s in slices}
        rows, reset = [], []
        prompt: tuple[list[int], list[int]] = ([], [])  # (row, token)
        output: tuple[list[int], list[int]] = ([], [])
        placeholders: tuple[list[int], list[int]] = ([], [])  # (row, previous step's row)
        for s in slices:
            if s.history is None:
                raise ValueError(f"{s.request_id}: a penalized slice needs its history")
            row, end = self._where.pop(s.request_id, (-1, -1))
            first = 0 if row < 0 or end != s.start_pos else s.start_pos  # the first position to count
            if row < 0:
                row = self._take(in_step)
            if first == 0:
                reset.append(row)
            tokens = s.history.tokens() if first == 0 else []  # positions 0 .. start_pos - 1
            if s.prev_row >= 0:
                placeholders[0].append(row)
                placeholders[1].append(s.prev_row)
            else:
                tokens = tokens + list(s.token_ids)
            p = max(0, min(s.history.prompt_len - first, len(tokens)))
            prompt[0].extend([row] * p)
            prompt[1].extend(tokens[:p])
            output[0].extend([row] * (len(tokens) - p))
            output[1].extend(tokens[p:])
            self._where[s.request_id] = (row, s.end_pos)
            rows.append(row)
        self._add(reset, prompt, output, placeholders, prev_tokens)
        return to_device(rows, self.device)

    def _take(self, in_step: set[str]) -> int:
        """A free row, else the row of the least recently seen request outside this step."""
        if self._free:
            return self._free.pop()
        victim = next(rid for rid in self._where if rid not in in_step)
        return self._where.pop(victim)[0]

    def _add(self, reset: list[int], prompt: tuple[list[int], list[int]], output: tuple[list[int], list[int]],
             placeholders: tuple[list[int], list[int]], prev_tokens: torch.Tensor | None) -> None:
        """Clear the reset rows, then count the tokens (all queued on the device, no sync)."""
        counts, in_prompt, dev = self._counts, self._prompt, self.device
        assert counts is not None and in_prompt is not None
        if reset:
            index = to_device(reset, dev)
            counts.index_fill_(0, index, 0.0)
            in_prompt.index_fill_(0, index, 0)
        one = torch.ones((), dtype=torch.float32, device=dev)
        if output[0]:
            counts.index_put_((to_device(output[0], dev), to_device(output[1], dev)), one, accumulate=True)
        if placeholders[0]:
            if prev_tokens is None:
                raise ValueError("a placeholder slice needs the previous step's tokens")
            last = prev_tokens[to_device(placeholders[1], dev)].long()
            counts.index_put_((to_device(placeholders[0], dev), last), one, accumulate=True)
        if prompt[0]:
            in_prompt.index_put_((to_device(prompt[0], dev), to_device(prompt[1], dev)),
                                 torch.ones((), dtype=torch.uint8, device=dev))


def process(logits: torch.Tensor, slices: Sequence[SeqSlice], prev_tokens: torch.Tensor | None = None,
            counts: PenaltyCounts | None = None) -> torch.Tensor:
    """logits [B, V] of the sampled slices (row b: slices[b]) with each row's logit_bias added,
    then its penalties applied: a new tensor, or `logits` itself when no slice has either.
    prev_tokens: the previous step's sampled tokens, which placeholder slices (prev_row >= 0)
    read; counts: the runner's, kept between steps (None: counted from scratch here)."""
    dev, given = logits.device, logits
    rows = [b for b, s in enumerate(slices) if s.sampling.logit_bias]
    if rows:
        r = [b for b in rows for _ in slices[b].sampling.logit_bias]
        cols = [t for b in rows for t, _ in slices[b].sampling.logit_bias]
        biases = [v for b in rows for _, v in slices[b].sampling.logit_bias]
        logits = logits.clone()
        logits.index_put_((to_device(r, dev), to_device(cols, dev)), to_device(biases, dev, logits.dtype),
                          accumulate=True)
    rows = [b for b, s in enumerate(slices) if s.sampling.penalized]
    if not rows:
        return logits
    penalized = [slices[b] for b in rows]
    if counts is None:
        counts = PenaltyCounts(logits.shape[1], logits.device, len(rows))
    slots = counts.count(penalized, prev_tokens)
    rep, freq, pres = (to_device([getattr(s.sampling, f) for s in penalized], dev, torch.float32)
                       for f in ("repetition_penalty", "frequency_penalty", "presence_penalty"))
    out = logits.clone() if logits is given else logits  # a biased copy is ours: penalized in place
    _apply(dev)(logits, out, to_device(rows, dev), slots, counts.generated, counts.in_prompt, rep, freq, pres)
    return out


def _apply(device: torch.device) -> Callable[..., None]:
    """apply_penalties for this device: the Triton kernel on CUDA (unless KERNEL_PENALTIES is
    off), else the reference."""
    return _triton_apply() if device.type == "cuda" and KERNEL_PENALTIES else reference.apply_penalties


@functools.lru_cache(maxsize=None)
def _triton_apply() -> Callable[..., None]:
    """pdserve.kernels.penalties.apply_penalties, imported on first use (Triton: CUDA only)."""
    from pdserve.kernels.penalties import apply_penalties

    return apply_penalties
