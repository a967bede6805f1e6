"""Presence, frequency and repetition penalties of some logits rows in one pass (Triton twin of
reference.apply_penalties).

Each program reads a block of one penalized row's logits with the same block of its request's
counts (times generated, float32) and in-prompt mask (uint8) and writes the penalized logits
into `out`: one read and one write per element, where the torch twin makes a dozen passes over
[rows, vocab] float32 temporaries.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, INDEX_DTYPES, check_device, check_dim, check_dtype
from pdserve.kernels._common import check_last_contiguous


@triton.jit
def _penalties_kernel(
    x_ptr, out_ptr, rows_ptr, slots_ptr, counts_ptr, prompt_ptr, rep_ptr, freq_ptr, pres_ptr,
    vocab, stride_x, stride_o, stride_c, stride_p, BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    row = tl.load(rows_ptr + i).to(tl.int64)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    n = tl.load(counts_ptr + slot * stride_c + cols, mask=mask, other=0.0)
    seen = (tl.load(prompt_ptr + slot * stride_p + cols, mask=mask, other=0) != 0) | (n > 0)
    rep = tl.load(rep_ptr + i)
    x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
    x = x - tl.load(freq_ptr + i) * n - tl.where(n > 0, tl.load(pres_ptr + i), 0.0)
    tl.store(out_ptr + row * stride_o + cols, x.to(out_ptr.dtype.element_ty), mask=mask)


def apply_penalties(
    logits: torch.Tensor, out: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, counts: torch.Tensor,
    in_prompt: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor,
) -> None:
    """out[rows[i]] = logits[rows[i]] penalized by the counts and mask of row slots[i] (see
    reference.apply_penalties); out's other rows are left as they are. out may be logits."""
    for name, t in (("logits", logits), ("out", out), ("counts", counts), ("in_prompt", in_prompt)):
        check_dim(name, t, 2)
        check_last_contiguous(name, t)
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_dtype("counts", counts, (torch.float32,))
    check_dtype("in_prompt", in_prompt, (torch.uint8,))
    assert out.shape == logits.shape and out.dtype == logits.dtype, "out must be like logits"
    vocab = logits.shape[1]
    assert counts.shape[1] == vocab and in_prompt.shape == counts.shape, "counts and in_prompt are [slots, vocab]"
    n = rows.shape[0]
    for name, t, dtype in (("rows", rows, INDEX_DTYPES), ("slots", slots, INDEX_DTYPES), ("rep", rep, (torch.float32,)),
                           ("freq", freq, (torch.float32,)), ("pres", pres, (torch.float32,))):
        check_dim(name, t, 1)
        check_dtype(name, t, dtype)
        assert t.shape[0] == n and t.is_contiguous(), f"{name} must be contiguous [{n}]"
    check_device(logits=logits, out=out, rows=rows, slots=slots, counts=counts, in_prompt=in_prompt, rep=rep,
                 freq=freq, pres=pres)
    if n == 0 or vocab == 0:
        return
    block = 2048
    _penalties_kernel[(n, triton.cdiv(vocab, block))](
        logits, out, rows, slots, counts, in_prompt, rep, freq, pres,
        vocab, logits.stride(0), out.stride(0), counts.stride(0), in_prompt.stride(0), BLOCK=block, num_warps=4,
    )
