"""Temperature sampling of each row of logits, the row split over programs (no probability
tensor, no sort): the OpenAI API's default (temperature 1, no top-p, no top-k).

Each program takes one chunk of one row and keeps the best Gumbel-max score of its tokens
(_gumbel.py) and its index; a second kernel picks each row's best chunk. The draw is the one
kernels/sample.py's one-program-per-row kernel makes for the same seed (a token's noise depends
on the seed and the token's index only), but a 128k-token row is spread over 16 programs, so
one row does not wait on one SM and 256 rows fill the GPU many times over.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import check_device
from pdserve.kernels._gumbel import LOG2E, check_draw, first_argmax, gumbel_scores

_BLOCK = 1024  # tokens per tile
# Tokens per program: 8192 (16 programs per 128k-token row) took 0.12 ms at 256 rows on an H100
# against 0.19 with 1024 and within 1-3 % with 4096-32768, and at 1-64 rows every choice took the
# same ~0.05 ms (two launches; bench/sampler.py --temperature-knobs,
# bench/results/sampler-knobs-h100-2026-12-06-s20d.json).
_CHUNK = 8192
MAX_CHUNKS = 128  # chunks per row at most: one tile of the pick kernel


@triton.jit(do_not_specialize=["chunk", "chunks"])
def _chunk_kernel(x_ptr, stride_b, v, temp_ptr, seed_ptr, best_ptr, arg_ptr, chunk, chunks,
                  BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    row = x_ptr + r.to(tl.int64) * stride_b
    scale = LOG2E / tl.load(temp_ptr + r)
    seed = tl.load(seed_ptr + r)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    arg = tl.full([BLOCK], -1, tl.int32)
    for start in range(c * chunk, tl.minimum(c * chunk + chunk, v), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row + offs, mask=offs < v, other=float("-inf")).to(tl.float32)
        score = gumbel_scores(x, scale, seed, start // 4, BLOCK)
        better = score > best
        best = tl.where(better, score, best)
        arg = tl.where(better, offs, arg)
    j = first_argmax(best, arg)
    tl.store(best_ptr + r * chunks + c, tl.max(best, 0))
    tl.store(arg_ptr + r * chunks + c, j)


@triton.jit
def _pick_kernel(best_ptr, arg_ptr, out_ptr, chunks, C_PAD: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, C_PAD)
    m = c < chunks
    best = tl.load(best_ptr + r * chunks + c, mask=m, other=float("-inf"))
    arg = tl.load(arg_ptr + r * chunks + c, mask=m, other=-1)
    j = first_argmax(best, arg)  # chunks hold increasing indices: the first chunk's wins a tie
    tl.store(out_ptr + r, tl.maximum(j, 0).to(tl.int64))  # a row of -inf only: token 0


def chunk_size(vocab: int, block: int = _BLOCK) -> int:
    """Tokens per program: whole tiles, at least _CHUNK tokens, and enough that a row has at
    most MAX_CHUNKS chunks."""
    tiles = triton.cdiv(vocab, block)
    return block * max(triton.cdiv(_CHUNK, block), triton.cdiv(tiles, MAX_CHUNKS))


def sample_temperature(
    logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
    *, block: int = _BLOCK, chunk: int | None = None, num_warps: int = 4,
) -> torch.Tensor:
    """One token per row of logits [B, V] (int64 [B]), drawn from softmax(logits / temperature).
    temperature float32 [B] (> 0; not checked on the device), seeds int64 [B]: the Philox key
    of the row's draw (equal seeds and logits give equal tokens, the token sample_top_p gives
    with top_p 1). -inf logits are never drawn; a row of -inf only gives token 0.
    block (tokens per tile, a power of two >= 16), chunk (tokens per program, a multiple of
    block; default chunk_size) and num_warps are tuning knobs: they never change the token."""
    b, v = check_draw(logits, temperature, seeds, block)
    chunk = chunk_size(v, block) if chunk is None else chunk
    assert chunk > 0 and chunk % block == 0, f"chunk {chunk} must be a positive multiple of block {block}"
    chunks = triton.cdiv(v, chunk)
    assert chunks <= MAX_CHUNKS, f"chunk {chunk} leaves {chunks} chunks of {v} tokens (at most {MAX_CHUNKS})"
    check_device(logits=logits, temperature=temperature, seeds=seeds)
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    best = torch.empty((b, chunks), dtype=torch.float32, device=logits.device)
    arg = torch.empty((b, chunks), dtype=torch.int32, device=logits.device)
    _chunk_kernel[(b, chunks)](logits, logits.stride(0), v, temperature, seeds, best, arg, chunk, chunks,
                               BLOCK=block, num_warps=num_warps)
    _pick_kernel[(b,)](best, arg, out, chunks, C_PAD=MAX_CHUNKS, num_warps=1)
    return out
