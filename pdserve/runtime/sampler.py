"""Batched token sampling: greedy, temperature, top-k, top-p, suppressed ids, per-request seeds.

A seeded request draws the token at position p from a generator seeded with
`position_seed(seed, p)` alone (on CUDA, a row without top-k draws in kernels/sample.py or
kernels/sample_temperature.py, whose Philox key is that seed), so a token does not depend on
batch composition, on the request's earlier draws, or on which worker (prefill or decode)
samples it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import TokenLogprobs

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_seed(seed: int, position: int) -> int:
    """Generator seed for the draw of the token at `position` of a request seeded `seed`."""
    return _splitmix64((_splitmix64(seed) + position) & _MASK64) >> 1  # 63 bits: any torch accepts


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    positions: Sequence[int],
    suppress: Sequence[Sequence[int]] | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """sample_on_device's tokens as a list (waits for them)."""
    return sample_on_device(logits, params, positions, suppress, generator).tolist()


def sample_on_device(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    positions: Sequence[int],
    suppress: Sequence[Sequence[int]] | None = None,
    generator: torch.Generator | None = None,
    allowed: Sequence[bytes | None] | None = None,
) -> torch.Tensor:
    """One token per row of `logits` [B, V], as an int64 tensor on its device (no host sync).

    positions[b] is the position the sampled token will take (SeqSlice.end_pos); it keys
    seeded draws. suppress[b] are ids masked to -inf first; allowed[b] (structured output,
    SeqSlice.allowed) a bitmask of the only ids that may be drawn. Unseeded non-greedy rows
    draw from `generator` (the runner's). Greedy means temperature 0 or top_k 1.
    """
    if allowed is not None and any(a is not None for a in allowed):
        logits = mask_disallowed(logits, allowed)
    if all(p.greedy for p in params) and not (suppress and any(suppress)):
        return argmax_rows(logits)  # in the logits' dtype: upcasting changes no order
    dev = logits.device
    if suppress is not None:
        rows = [b for b, ids in enumerate(suppress) for _ in ids]
        cols = [t for ids in suppress for t in ids]
        if rows:
            logits = logits.clone()  # masked in place; the caller's tensor stays intact
            # index_put_ with a device value: a Python scalar would be copied from host memory
            logits.index_put_((to_device(rows, dev), to_device(cols, dev)),
                              torch.full((), float("-inf"), device=dev, dtype=logits.dtype))
    rows = [b for b, p in enumerate(params) if not p.greedy]
    if not rows:
        return argmax_rows(logits)
    groups: dict[Draw, list[int]] = {}
    for b in rows:
        groups.setdefault(_kernel_draw(params[b], logits.shape[1], dev) or _sorted_draw, []).append(b)
    if len(groups) == 1 and len(rows) == len(params):  # all drawn one way: no gather, no scatter
        return next(iter(groups))(logits, params, positions, generator)
    out = argmax_rows(logits)
    for draw, g in groups.items():
        index = to_device(g, dev)
        out.index_copy_(0, index, draw(logits.index_select(0, index), [params[b] for b in g],
                                       [positions[b] for b in g], generator))
    return out


def mask_disallowed(logits: torch.Tensor, allowed: Sequence[bytes | None]) -> torch.Tensor:
    """A copy of logits [B, V] with -inf where allowed[b] (a bitmask: bit t % 8 of byte t // 8
    for token t; ids past its end count as unset) does not allow the token; None rows are
    left whole. The masks go up in one queued copy (no sync)."""
    rows = [b for b, a in enumerate(allowed) if a is not None]
    n, v = len(rows), logits.shape[1]
    width = (v + 7) // 8
    buf = bytearray(n * width)
    for i, b in enumerate(rows):
        m = allowed[b][:width]  # type: ignore[index]
        buf[i * width : i * width + len(m)] = m
    dev = logits.device
    host = torch.frombuffer(buf, dtype=torch.uint8).view(n, width)
    packed = host.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else host
    shifts = torch.arange(8, dtype=torch.uint8, device=dev)
    keep = ((packed[:, :, None] >> shifts) & 1).view(n, width * 8)[:, :v].bool()
    out = logits.clone()
    if n == logits.shape[0]:
        return out.masked_fill_(~keep, float("-inf"))
    index = to_device(rows, dev)
    return out.index_copy_(0, index, out.index_select(0, index).masked_fill_(~keep, float("-inf")))


Draw = Callable[[torch.Tensor, Sequence[SamplingParams], Sequence[int], "torch.Generator | None"], torch.Tensor]

# Rows without top-k draw in one Triton pass on CUDA (no probability tensor, no sort): top-p
# rows in kernels/sample.py, temperature-only rows (the OpenAI default) in
# kernels/sample_temperature.py, which spreads each row over programs; every other drawn row
# goes through token_probs + _draw. One sampling call of 128k-token rows on an H100, 1 / 32 /
# 256 rows: top-p 0.9 0.17 / 0.25 / 0.56 ms against 0.38 / 0.96 / 2.19 for the best of the
# sorted and threshold paths; temperature alone 0.15 / 0.13 / 0.41 against 0.12 / 0.17 / 0.75,
# seeded 0.16 / 0.16 / 0.65 against 0.15 / 0.48 / 3.08 (bench/results/sampler-h100-2026-12-06-s20c.json,
# with 1024 tokens per program; 8192 since, 0.19 -> 0.12 ms for the kernels at 256 rows).
KERNEL_SAMPLING = True


def _kernel_draw(p: SamplingParams, vocab: int, device: torch.device) -> Draw | None:
    """The Triton draw for a row with these settings on this device, or None (a row's own
    settings and the device decide, never the batch: seeded draws rest on it)."""
    if not (KERNEL_SAMPLING and device.type == "cuda") or (0 < p.top_k < vocab) or p.min_p > 0:
        return None
    return _top_p_draw if p.top_p < 1.0 else _temperature_draw


def _kernel_seeds(params: Sequence[SamplingParams], positions: Sequence[int], generator: torch.Generator | None,
                  dev: torch.device) -> torch.Tensor:
    """Each row's Philox key: position_seed(seed, position) for a seeded row, else drawn from
    `generator` (on the device: no sync)."""
    seeded = [r for r, p in enumerate(params) if p.seed is not None]
    keys = [position_seed(params[r].seed, positions[r]) for r in seeded]  # type: ignore[arg-type]
    if len(seeded) == len(params):
        return to_device(keys, dev)
    seeds = torch.randint(0, 2**62, (len(params),), generator=generator, device=dev)
    if seeded:
        seeds.index_copy_(0, to_device(seeded, dev), to_device(keys, dev))
    return seeds


def _top_p_draw(logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int],
                generator: torch.Generator | None) -> torch.Tensor:
    """kernels.sample.sample_top_p over top-p rows without top-k."""
    dev = logits.device
    temps = to_device([p.temperature for p in params], dev, torch.float32)
    top_p = to_device([p.top_p for p in params], dev, torch.float32)
    return _triton_sample()(logits, temps, top_p, _kernel_seeds(params, positions, generator, dev))


def _temperature_draw(logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int],
                      generator: torch.Generator | None) -> torch.Tensor:
    """kernels.sample_temperature over rows with temperature alone (the token sample_top_p
    would draw for the same key)."""
    dev = logits.device
    temps = to_device([p.temperature for p in params], dev, torch.float32)
    return _triton_sample_temperature()(logits, temps, _kernel_seeds(params, positions, generator, dev))


def _sorted_draw(logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int],
                 generator: torch.Generator | None) -> torch.Tensor:
    """token_probs in float32, then the exponential race of _draw."""
    probs = token_probs(logits.float(), params)
    return _draw(probs, [p.seed for p in params], positions, generator)


def to_device(values: Sequence[int] | Sequence[float], device: torch.device,
              dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A small host list as a tensor on `device` without waiting for the device: on CUDA it is
    copied from pinned memory by a queued copy (a copy from pageable memory first waits for
    every kernel queued on the stream, which would stall an overlapped engine loop on every
    step with a sampled row)."""
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


@dataclass(frozen=True)
class QueuedLogprobs:
    """Log-probabilities of the sampled tokens of some rows, queued on the device.

    rows[i] is the index (among the sampled rows) of entry i, which lists ks[i] alternatives;
    chosen [R] and top [R, K] are float32, top_ids [R, K] int64 (K = max(ks)); ranks [R] int64
    (the chosen tokens' ranks in the vocabulary) when asked for."""

    rows: list[int]
    ks: list[int]
    chosen: torch.Tensor
    top: torch.Tensor
    top_ids: torch.Tensor
    ranks: torch.Tensor | None = None

    def to_host(self) -> QueuedLogprobs:
        """The same, copied by queued copies into pinned host memory (CUDA; read after a sync)."""
        if self.chosen.device.type != "cuda":
            return self
        copy = lambda t: torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)  # noqa: E731
        ranks = copy(self.ranks) if self.ranks is not None else None
        return QueuedLogprobs(self.rows, self.ks, copy(self.chosen), copy(self.top), copy(self.top_ids), ranks)

    def entries(self) -> list[TokenLogprobs]:
        """One TokenLogprobs per row (waits for the device if the tensors are on it)."""
        chosen, top, ids = self.chosen.tolist(), self.top.tolist(), self.top_ids.tolist()
        ranks = self.ranks.tolist() if self.ranks is not None else [None] * len(chosen)
        return [TokenLogprobs(c, tuple(zip(i[:k], v[:k])), r)
                for c, v, i, k, r in zip(chosen, top, ids, self.ks, ranks)]


def queue_logprobs(logits: torch.Tensor, tokens: torch.Tensor, params: Sequence[SamplingParams]) -> QueuedLogprobs | None:
    """Logprobs of the rows whose params ask for them (None: no row does): the log-softmax of
    the raw logits (before temperature, top-k/top-p and suppression, as vLLM reports them) at
    the sampled token (tokens [B], on the device) and its top params.logprobs entries. No sync."""
    rows = [r for r, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return None
    ks = [params[r].logprobs or 0 for r in rows]
    index = None if len(rows) == len(params) else to_device(rows, logits.device)
    sub = logits if index is None else logits.index_select(0, index)
    picked = tokens if index is None else tokens.index_select(0, index)
    return token_logprobs(sub, picked, rows, ks)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, rows: list[int], ks: list[int],
                   k: int | None = None, rank: bool = False) -> QueuedLogprobs:
    """QueuedLogprobs of every row of logits [R, V]: the log-softmax at tokens [R] and the top
    k (default max(ks)) entries; with `rank`, each token's rank too (one compare pass). No sync."""
    lp = logits.float().log_softmax(dim=-1)
    k = min(max(ks) if k is None else k, lp.shape[1])  # a vocabulary smaller than asked: all of it
    # Ranking the bf16 logits instead (same order, half the bytes) timed 0.68x the float top-k
    # alone on an H100, yet a 2k prompt's 5 prompt logprobs took 74.9 ms against 67.5 through the
    # runner (bench/results/plp-probe-h100-2026-12-07-s26c.json, engine-extras-h100-2026-12-07-s26c.json).
    top, top_ids = lp.topk(k, dim=-1) if k else (lp[:, :0], tokens.new_zeros((lp.shape[0], 0), dtype=torch.int64))
    chosen = lp.gather(1, tokens.view(-1, 1).long())
    ranks = (lp > chosen).sum(dim=-1) + 1 if rank else None
    return QueuedLogprobs(rows, ks, chosen.squeeze(1), top, top_ids, ranks)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1) (the first index of the maximum), in two stages for a few rows
    whose vocab splits into 64+ equal chunks: a reduction over one long row runs on one thread
    block (27 us for Llama-3's 128k vocab on an H200, 4 us in two stages), over many short rows
    on many; at 256 rows the plain argmax is the faster (54 vs 70 us)."""
    b, v = logits.shape
    chunk = _chunk(v)
    if chunk is None or b > 8 or logits.stride(-1) != 1:
        return logits.argmax(dim=-1)
    best, idx = logits.view(b, v // chunk, chunk).max(dim=-1)  # first max of each chunk
    top = best.argmax(dim=-1, keepdim=True)  # the first chunk holding the row's max
    return (top * chunk + idx.gather(1, top)).squeeze(1)


@functools.lru_cache(maxsize=None)
def _chunk(v: int) -> int | None:
    """The smallest divisor of v that is >= sqrt(v), if it leaves 64+ chunks; else None (once
    per vocab size: the search runs up to v / 64 steps for a prime v)."""
    if v < 4096:
        return None
    for c in range(int(v**0.5), v // 64 + 1):
        if c > 0 and v % c == 0:
            return c
    return None


def token_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Probabilities [B, V] after temperature, top-k, top-p and min_p (non-greedy params only):
    _cut_probs, then tokens less likely than min_p times the row's most likely get none (and
    the rest is renormalized: rejection sampling reads probabilities)."""
    probs = _cut_probs(logits, params)
    if any(p.min_p > 0 for p in params):
        min_p = to_device([p.min_p for p in params], logits.device, torch.float32)
        probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _cut_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Probabilities [B, V] after temperature, top-k and top-p. On CUDA with
    TRITON_NUCLEUS_MIN_ROWS+ rows the tokens below each row's Triton nucleus_threshold get none
    (no sort: pdserve.kernels.nucleus); otherwise _sorted_probs."""
    dev = logits.device
    temps = to_device([p.temperature for p in params], dev, torch.float32)
    x = logits / temps[:, None]
    if all(p.top_k < 1 and p.top_p >= 1.0 for p in params):
        return x.softmax(dim=-1)
    ks = to_device([p.top_k for p in params], dev)
    top_p = to_device([p.top_p for p in params], dev, torch.float32)
    if dev.type == "cuda" and x.shape[0] >= TRITON_NUCLEUS_MIN_ROWS:
        low = _triton_nucleus()(logits, temps, ks, top_p)
        return x.masked_fill_(logits < low[:, None], float("-inf")).softmax(dim=-1)
    return _sorted_probs(x, ks, top_p)


# Rows from which the Triton nucleus_threshold (one program per row, a pass over it per search
# step) beats sorting. On an H100 (bench/results/sampler-h100-2026-12-05-s14b.json) top-p
# sampling takes 1.04 ms sorted vs 0.97 through the kernel at 32 rows, 1.57 vs 1.07 at 64 and
# 5.10 vs 2.13 at 256; with top-k as well sorting still wins at 64 rows (1.59 vs 1.77 ms) and
# loses from 128 (3.69 vs 2.48). One bound for both keeps the rule simple.
TRITON_NUCLEUS_MIN_ROWS = 64


def _sorted_probs(x: torch.Tensor, ks: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """token_probs by sorting x (logits / temperature): the top_k[b] first ranks (< 1: all),
    then the most likely run whose mass before the last token is under top_p[b]."""
    v = x.shape[-1]
    sorted_x, idx = x.sort(dim=-1, descending=True)
    ranks = torch.arange(v, device=x.device)
    sorted_x.masked_fill_(ranks[None, :] >= torch.where(ks >= 1, ks, v)[:, None], float("-inf"))
    sp = sorted_x.softmax(dim=-1)
    # Drop a token once the mass before it reaches top_p (top_p >= 1 keeps all, even where the
    # cumulative sum rounds past 1); the most likely one always stays.
    drop = ((sp.cumsum(dim=-1) - sp) >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_x.masked_fill_(drop, float("-inf"))
    return torch.full_like(x, float("-inf")).scatter_(-1, idx, sorted_x).softmax(dim=-1)


@functools.lru_cache(maxsize=None)
def _triton_sample() -> Callable[..., torch.Tensor]:
    """pdserve.kernels.sample.sample_top_p, imported on first use (Triton: CUDA only)."""
    from pdserve.kernels.sample import sample_top_p

    return sample_top_p


@functools.lru_cache(maxsize=None)
def _triton_sample_temperature() -> Callable[..., torch.Tensor]:
    """pdserve.kernels.sample_temperature.sample_temperature, imported on first use (Triton)."""
    from pdserve.kernels.sample_temperature import sample_temperature

    return sample_temperature


@functools.lru_cache(maxsize=None)
def _triton_nucleus() -> Callable[..., torch.Tensor]:
    """pdserve.kernels.nucleus.nucleus_threshold, imported on first use (Triton: CUDA only)."""
    from pdserve.kernels.nucleus import nucleus_threshold

    return nucleus_threshold


def _draw(
    probs: torch.Tensor, seeds: Sequence[int | None], positions: Sequence[int],
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Exponential race (argmax p / E, E ~ Exp(1)) == a categorical draw, without a sync. The
    runner's generator is drawn from only when some row is unseeded."""
    noise = torch.empty_like(probs)
    if any(seed is None for seed in seeds):
        noise.exponential_(generator=generator)
    for r, (seed, pos) in enumerate(zip(seeds, positions)):
        if seed is not None:
            g = torch.Generator(device=probs.device).manual_seed(position_seed(seed, pos))
            noise[r].exponential_(generator=g)
    return (probs / noise).argmax(dim=-1)
