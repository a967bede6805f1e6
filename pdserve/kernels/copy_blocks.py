"""Copy whole KV blocks between two pools (Triton twin of reference.copy_blocks).

The cuda_ipc transfer's gather/scatter: block src_ids[i] of every plane of the source pool goes
to block dst_ids[i] of the destination (a peer's pool mapped over CUDA IPC, or any pool of the
same block shape). A block is contiguous in every pool layout pdserve uses ([.., N, S, Hk, row]
with row = D values, or D + 4 bytes when quantized), so each program copies a run of 32-bit
words with wide loads; no temporary.

`PoolCopy` checks two whole pools [L, P, N, ...] once and then launches per call with no tensor
work on the host: one layer's planes (`layer=l`, the layer-wise push) or every layer in one
launch (`layer=None`). `copy_blocks` is the one-call form for one layer's planes [P, N, ...].
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import INDEX_DTYPES, check_device

_WORDS = 1024  # 32-bit words per program (4 KiB): best of 1-8 Ki words x 4-16 warps on an H200 (bench/ipc_probe.py copy)
_ID_ROW = 4  # int32 ids per 16 bytes: callers keep id vectors 16-byte aligned (one kernel variant)


@triton.jit(do_not_specialize=["plane0"])
def _copy_blocks_kernel(
    src_ptr, dst_ptr, src_ids_ptr, dst_ids_ptr, plane0,
    src_stride_p, src_stride_n, dst_stride_p, dst_stride_n, words,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    plane = (plane0 + tl.program_id(1)).to(tl.int64)
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


class PoolCopy:
    """Block copies between two pools [L, P, N, ...] of equal block shape and dtype (the block
    counts N may differ), checked once. Ids are not bounds-checked here (the transfer checks
    them against both pools first)."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, words_per_program: int = _WORDS,
                 num_warps: int = 4) -> None:
        assert src.dim() >= 4 and dst.dim() >= 4, (
            f"pools must be [layers, planes, blocks, ...], got {tuple(src.shape)} and {tuple(dst.shape)}")
        assert src.dtype == dst.dtype, f"src dtype {src.dtype} != dst dtype {dst.dtype}"
        assert src.shape[:2] == dst.shape[:2] and src.shape[3:] == dst.shape[3:], (
            f"src blocks {tuple(src.shape)} and dst blocks {tuple(dst.shape)} differ")
        self.device = check_device(src=src, dst=dst)
        self.layers, self.planes = src.shape[0], src.shape[1]
        assert src.stride(0) == self.planes * src.stride(1) and dst.stride(0) == self.planes * dst.stride(1), (
            "layers of a pool must be packed (planes of one layer next to each other)")
        self._src = _words("src", src.flatten(0, 1))  # [L*P, N, W]: a view (checked above)
        self._dst = _words("dst", dst.flatten(0, 1))
        words = self._src.shape[2]
        assert words_per_program > 0 and words_per_program & (words_per_program - 1) == 0, (
            f"words_per_program must be a power of 2, got {words_per_program}")
        self._block = min(words_per_program, triton.next_power_of_2(words))
        self._chunks = triton.cdiv(words, self._block)
        self._warps = num_warps
        self._args = (self._src.stride(0), self._src.stride(1), self._dst.stride(0), self._dst.stride(1), words)

    def warm_up(self) -> None:
        """Compile and load the kernel variant these pools use (Triton specialises on pointer
        alignment and on strides divisible by 16) by copying a private scratch block whose
        views carry the pools' strides; a first load in a real push would wait for the device."""
        words = self._args[-1]
        row = -(-words // _ID_ROW) * _ID_ROW  # both scratch rows 16-byte aligned, like pool bases
        scratch = torch.zeros((2, row), dtype=torch.int32, device=self.device)
        src = scratch[0].as_strided((1, 1, words), self._args[:2] + (1,))
        dst = scratch[1].as_strided((1, 1, words), self._args[2:4] + (1,))
        ids = torch.zeros(_ID_ROW, dtype=torch.int32, device=self.device)
        _copy_blocks_kernel[(1, 1, self._chunks)](src, dst, ids, ids, 0, *self._args,
                                                   BLOCK=self._block, num_warps=self._warps)

    def __call__(self, src_ids: torch.Tensor, dst_ids: torch.Tensor, layer: int | None = None) -> None:
        """dst[layer, :, dst_ids[i]] = src[layer, :, src_ids[i]]; every layer when layer is None.
        Ids: int32/int64 vectors of equal length on the pools' device."""
        assert src_ids.shape == dst_ids.shape and src_ids.dim() == 1, (
            f"src_ids {tuple(src_ids.shape)} and dst_ids {tuple(dst_ids.shape)} must be equal 1-D")
        assert src_ids.dtype in INDEX_DTYPES and dst_ids.dtype in INDEX_DTYPES, "block ids must be int32/int64"
        assert src_ids.device == self.device and dst_ids.device == self.device, "block ids must be on the pools' device"
        assert src_ids.is_contiguous() and dst_ids.is_contiguous(), "block id vectors must be contiguous"
        if layer is None:
            plane0, planes = 0, self.layers * self.planes
        else:
            assert 0 <= layer < self.layers, f"layer {layer} out of range [0, {self.layers})"
            plane0, planes = layer * self.planes, self.planes
        n = src_ids.shape[0]
        if n == 0:
            return
        _copy_blocks_kernel[(n, planes, self._chunks)](
            self._src, self._dst, src_ids, dst_ids, plane0, *self._args, BLOCK=self._block, num_warps=self._warps)


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    """dst[:, dst_ids[i]] = src[:, src_ids[i]] for every i (in place on dst).

    src, dst: [P, N, ...] pools of one layer (P planes, e.g. K and V) with equal block shape
    and dtype; src_ids, dst_ids: int32/int64 vectors of equal length on the pools' device.
    Ids are not bounds-checked here (the transfer checks them against both pools first).
    """
    assert src.dim() >= 3 and dst.dim() >= 3, (
        f"src and dst must be [planes, blocks, ...], got {tuple(src.shape)} and {tuple(dst.shape)}")
    PoolCopy(src[None], dst[None])(src_ids, dst_ids, 0)  # one layer of P planes
