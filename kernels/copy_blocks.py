"""Copy whole KV blocks between two pools (Triton twin of reference.copy_blocks).

The cuda_ipc transfer's one gather/scatter per layer: block src_ids[i] of every plane (K and V)
of one layer of the source pool goes to block dst_ids[i] of the destination (a peer's pool
mapped over CUDA IPC, or any pool of the same block shape). A block is contiguous in every
pool layout pdserve uses ([.., N, S, Hk, row] with row = D values, or D + 4 bytes when
quantized), so each program copies a run of 32-bit words with wide loads; no temporary.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._common import INDEX_DTYPES, check_device, check_dim, check_dtype

_WORDS = 2048  # 32-bit words per program (8 KiB)


@triton.jit
def _copy_blocks_kernel(
    src_ptr, dst_ptr, src_ids_ptr, dst_ids_ptr,
    src_stride_p, src_stride_n, dst_stride_p, dst_stride_n, words,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    plane = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2)
    s = tl.load(src_ids_ptr + i).to(tl.int64)
    d = tl.load(dst_ids_ptr + i).to(tl.int64)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    m = offs < words
    x = tl.load(src_ptr + plane * src_stride_p + s * src_stride_n + offs, mask=m)
    tl.store(dst_ptr + plane * dst_stride_p + d * dst_stride_n + offs, x, mask=m)


def _words(name: str, pool: torch.Tensor) -> torch.Tensor:
    """[P, N, *block] -> [P, N, W] int32 view; every block must be contiguous."""
    assert pool.dim() >= 3, f"{name} must be [planes, blocks, ...], got shape {tuple(pool.shape)}"
    block = pool.shape[2:]
    elems = math.prod(block)
    assert pool[0, 0].is_contiguous() or pool.shape[1] == 0, f"{name}: a block must be contiguous"
    nbytes = elems * pool.element_size()
    assert nbytes % 4 == 0, f"{name}: a block of {nbytes} bytes is not a whole number of 32-bit words"
    assert pool.stride(1) == elems or pool.shape[1] <= 1, (
        f"{name}: blocks must be packed (stride {pool.stride(1)}, block of {elems} elements)")
    flat = pool.reshape(pool.shape[0], pool.shape[1], elems)  # a view: blocks are packed
    return flat.view(torch.int32)


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    """dst[:, dst_ids[i]] = src[:, src_ids[i]] for every i (in place on dst).

    src, dst: [P, N, ...] pools of one layer (P planes, e.g. K and V) with equal block shape
    and dtype; src_ids, dst_ids: int32/int64 vectors of equal length on the pools' device.
    Ids are not bounds-checked here (the transfer checks them against both pools first).
    """
    check_dim("src_ids", src_ids, 1)
    check_dim("dst_ids", dst_ids, 1)
    check_dtype("src_ids", src_ids, INDEX_DTYPES)
    check_dtype("dst_ids", dst_ids, INDEX_DTYPES)
    assert src_ids.shape == dst_ids.shape, f"src_ids {tuple(src_ids.shape)} != dst_ids {tuple(dst_ids.shape)}"
    assert src_ids.is_contiguous() and dst_ids.is_contiguous(), "block id vectors must be contiguous"
    assert src.dtype == dst.dtype, f"src dtype {src.dtype} != dst dtype {dst.dtype}"
    assert src.shape[0] == dst.shape[0] and src.shape[2:] == dst.shape[2:], (
        f"src blocks {tuple(src.shape)} and dst blocks {tuple(dst.shape)} differ")
    check_device(src=src, dst=dst, src_ids=src_ids, dst_ids=dst_ids)
    n = src_ids.shape[0]
    if n == 0:
        return
    s, d = _words("src", src), _words("dst", dst)
    words = s.shape[2]
    grid = (n, s.shape[0], triton.cdiv(words, _WORDS))
    _copy_blocks_kernel[grid](
        s, d, src_ids, dst_ids, s.stride(0), s.stride(1), d.stride(0), d.stride(1), words,
        BLOCK=min(_WORDS, triton.next_power_of_2(words)), num_warps=4,
    )
