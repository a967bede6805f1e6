"""Routed experts of a mixture-of-experts MLP (Triton twin of reference.moe_experts).

A step's T tokens each pick k experts: T*k (token, expert) pairs. `expert_tiles` groups the
pairs by expert into tiles of BLOCK_M rows (each expert's run padded to a whole tile) with
fixed shapes (torch ops, or one Triton program: TILES_KERNEL_MAX_PAIRS): no host sync, and a
CUDA graph can hold it. One program multiplies a tile's rows by a BLOCK_N slice of its
expert's weight: an expert's weights are read once per tile, so at batch 1 only the chosen
experts' weights are read, and at large batches a tile is a real matrix product. Tiles past the last expert's run find no expert and return.

Two launches of the same kernel around a SiLU-and-mul: x @ gate_up[e]^T, then @ down[e]^T;
a token's k rows are then weighted by the router and summed in float32 (rounded where the
reference rounds them).

Few pairs (decode at small batches) skip the grouping: a program streams BLOCK_N rows of a
pair's expert weight as the batch-1 gemv does (pdserve.kernels.gemv), with the SiLU-and-mul in
the gate_up launch's epilogue, and the down launch sums a token's k pairs, router-scaled, in
its accumulator (no [T*k, H] intermediate, no separate sum). Pairs sharing an expert then read
its weights once each, which costs little while pairs are few and mostly on distinct experts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._attention import mm
from pdserve.kernels._common import FLOAT_DTYPES, check_device, check_dim, check_dtype, dot_precision
from pdserve.kernels._common import interpreting, next_pow2
from pdserve.kernels.gemv import store_rows, weight_rows
from pdserve.kernels.silu_and_mul import silu_and_mul


@triton.jit(do_not_specialize=["pairs"])  # T*k follows the batch: one variant for all
def _moe_gemm_kernel(
    a_ptr, w_ptr, c_ptr, rows_ptr, tile_expert_ptr, pairs, n_out, k_in, num_experts,
    stride_a, stride_we, stride_wn, stride_c,
    A_DIV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):
    tile = tl.program_id(0)
    e = tl.load(tile_expert_ptr + tile)
    if e < num_experts:
        rows = tl.load(rows_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # pairs: padding
        rmask = rows < pairs
        a_rows = rows // A_DIV  # the first product reads a token's row once for each of its k pairs
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < n_out
        w_base = w_ptr + e.to(tl.int64) * stride_we + n.to(tl.int64)[None, :] * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, k_in, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < k_in
            a = tl.load(a_ptr + a_rows[:, None] * stride_a + k[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_base + k[:, None], mask=kmask[:, None] & nmask[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
            acc += mm(a, w, PRECISION, DOT_F32)
        out = c_ptr + rows[:, None] * stride_c + n[None, :]
        tl.store(out, acc.to(c_ptr.dtype.element_ty), mask=rmask[:, None] & nmask[None, :])


@triton.jit
def _moe_gemv_kernel(
    a_ptr, w_ptr, c_ptr, ids_ptr, scale_ptr, n_out, k_in, stride_a, stride_we, stride_wn, stride_c,
    A_DIV: tl.constexpr, PAIRS: tl.constexpr, GLU: tl.constexpr, SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (i, pid) writes BLOCK_N columns of output row i: the sum over pairs i*PAIRS ..
    i*PAIRS + PAIRS-1 of (scale of the pair) * (its expert's rows @ input row pair // A_DIV).
    gate_up: one pair a row (A_DIV = k, GLU); down: a token's k pairs a row, router-scaled."""
    i = tl.program_id(0)
    pid = tl.program_id(1)
    n, nmask = weight_rows(pid, n_out, BLOCK_N, GLU)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for p in tl.static_range(PAIRS):
        pair = i * PAIRS + p
        e = tl.load(ids_ptr + pair).to(tl.int64)
        a_row = a_ptr + (pair // A_DIV).to(tl.int64) * stride_a
        rows = w_ptr + e * stride_we + n.to(tl.int64)[:, None] * stride_wn
        s = tl.load(scale_ptr + pair) if SCALE else 1.0
        for k0 in range(0, k_in, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < k_in
            x = tl.load(a_row + k, mask=kmask, other=0.0).to(tl.float32) * s
            w = tl.load(rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, 1)
    store_rows(c_ptr + i.to(tl.int64) * stride_c, y, n, nmask, pid, n_out, BLOCK_N, GLU)


# At most this many (token, expert) pairs take the gemv path (decode at small batches).
GEMV_MAX_PAIRS = 64


# Up to this many pairs expert_tiles runs as one Triton program (decode batches; a longer
# prefill's grouping is a small share of its expert products). 0 until a GPU has timed it
# against the torch grouping (49-82 us at 1-256 tokens on an H100): `bash bench/gpu_s30d.sh`
# checks the two equal and times both in CUDA graphs; the tests run it whatever this says.
TILES_KERNEL_MAX_PAIRS = 0


@triton.jit(do_not_specialize=["pairs", "n_tiles"])  # both follow the batch
def _expert_tiles_kernel(
    ids_ptr, rows_ptr, tile_expert_ptr, pairs, n_tiles, num_experts,
    BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """One program: per-expert counts, each run's first row, the tiles' experts, then every
    pair's row (its run's first row + the pairs of its expert before it), chunk by chunk so the
    order within a run is the pairs' order, as expert_tiles_torch's stable sort gives."""
    e = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], tl.int32)
    for p0 in range(0, pairs, BLOCK):
        p = p0 + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + p, mask=p < pairs, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == e[None, :]).to(tl.int32), 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    real = (e < num_experts).to(tl.int32)
    for t0 in range(0, n_tiles, BLOCK_T):  # a tile's expert: the runs that end at or before it
        t = t0 + tl.arange(0, BLOCK_T)
        owner = tl.sum((ends[None, :] <= (t * BLOCK_M)[:, None]).to(tl.int32) * real[None, :], 1)
        tl.store(tile_expert_ptr + t, owner, mask=t < n_tiles)
    next_row = ends - padded  # each expert's next free row
    i = tl.arange(0, BLOCK)
    for p0 in range(0, pairs, BLOCK):
        p = p0 + i
        ids = tl.load(ids_ptr + p, mask=p < pairs, other=-1).to(tl.int32)
        onehot = (ids[:, None] == e[None, :]).to(tl.int32)
        earlier = ((ids[:, None] == ids[None, :]) & (i[None, :] < i[:, None])).to(tl.int32)
        row = tl.sum(onehot * next_row[None, :], 1) + tl.sum(earlier, 1)
        tl.store(rows_ptr + row, p.to(tl.int32), mask=p < pairs)
        next_row += tl.sum(onehot, 0)


def _rows_size(pairs: int, num_experts: int, block_m: int) -> int:
    """Rows of the grouping: round_up(pairs + E*(block_m-1), block_m), the most any routing needs."""
    return triton.cdiv(pairs + num_experts * (block_m - 1), block_m) * block_m


def expert_tiles(ids: torch.Tensor, num_experts: int, block_m: int,
                 max_kernel_pairs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Group the pairs of ids [T, k] by expert: (rows [P] int32, tile_expert [P / block_m] int32).

    rows lists pair indices (t * k + j) expert by expert, in pair order within an expert, each
    expert's run padded with the sentinel T*k to a multiple of block_m; tile_expert[i] is the
    expert of rows[i*block_m:...], num_experts for tiles past the last run. P (_rows_size) is the
    most any routing needs, so every shape is fixed by (T, k, E, block_m) and a CUDA graph holds
    it. max_kernel_pairs: TILES_KERNEL_MAX_PAIRS unless given."""
    pairs = ids.numel()
    if pairs > (TILES_KERNEL_MAX_PAIRS if max_kernel_pairs is None else max_kernel_pairs):
        return expert_tiles_torch(ids, num_experts, block_m)
    size = _rows_size(pairs, num_experts, block_m)
    rows = torch.full((size,), pairs, dtype=torch.int32, device=ids.device)
    tile_expert = torch.empty(size // block_m, dtype=torch.int32, device=ids.device)
    _expert_tiles_kernel[(1,)](ids.reshape(-1).contiguous(), rows, tile_expert, pairs, size // block_m, num_experts,
                               BLOCK_M=block_m, BLOCK_E=next_pow2(num_experts), BLOCK=64, BLOCK_T=64, num_warps=8)
    return rows, tile_expert


def expert_tiles_torch(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """expert_tiles in plain torch, the same results (twenty-odd small kernels; also for pair
    counts past TILES_KERNEL_MAX_PAIRS, where one program would loop too long)."""
    flat = ids.reshape(-1)
    pairs = flat.numel()
    size = _rows_size(pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)  # pair indices, expert by expert
    expert = flat[order]
    first = (counts.cumsum(0) - counts)[expert]  # index in `order` where this expert's run starts
    dest = (ends - padded)[expert] + torch.arange(pairs, device=ids.device) - first
    rows = torch.full((size,), pairs, dtype=torch.int32, device=ids.device)
    rows[dest] = order.to(torch.int32)
    starts = torch.arange(0, size, block_m, device=ids.device)
    tile_expert = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    return rows, tile_expert


def _tiled_gemm(a: torch.Tensor, w: torch.Tensor, rows: torch.Tensor, tile_expert: torch.Tensor, pairs: int,
                a_div: int, block_m: int, block_n: int = 64, block_k: int = 128, num_stages: int = 3) -> torch.Tensor:
    e, n_out, k_in = w.shape
    out = torch.empty((pairs, n_out), dtype=a.dtype, device=a.device)
    grid = (tile_expert.numel(), triton.cdiv(n_out, block_n))
    _moe_gemm_kernel[grid](
        a, w, out, rows, tile_expert, pairs, n_out, k_in, e, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        A_DIV=a_div, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=64 if interpreting() else block_k,
        PRECISION=dot_precision(a.dtype), DOT_F32=interpreting(), num_warps=4, num_stages=num_stages,
    )
    return out


def _gemv(a: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, top_k: int,
          gate_up: bool, block_n: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """gate_up: [T*k, I] activations of the pairs; down: [T, H], each token's k pairs summed
    with their router weights. ids and weights: the pairs', [T*k] contiguous."""
    _, n, k_in = w.shape
    n_out = n // 2 if gate_up else n
    out = torch.empty((ids.numel() // (1 if gate_up else top_k), n_out), dtype=a.dtype, device=a.device)
    block_n = block_n or (16 if gate_up else 8)
    block_k = 512 if k_in % 512 == 0 else 256 if k_in % 256 == 0 else 128
    grid = (out.shape[0], triton.cdiv(n_out, block_n // 2 if gate_up else block_n))
    _moe_gemv_kernel[grid](a, w, out, ids, weights, n_out, k_in, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
                           A_DIV=top_k if gate_up else 1, PAIRS=1 if gate_up else top_k, GLU=gate_up,
                           SCALE=not gate_up, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    return out


def moe_experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
    *, gemv: bool | None = None,
) -> torch.Tensor:
    """sum over j of weights[t, j] * down[e] @ silu_and_mul(gate_up[e] @ x[t]), e = ids[t, j].
    x [T, H]; weights [T, k] float32; ids [T, k] int64; gate_up [E, 2I, H]; down [E, H, I].
    gemv: the per-pair path (default: when T*k <= GEMV_MAX_PAIRS), else expert tiles."""
    check_dim("x", x, 2)
    check_dim("gate_up", gate_up, 3)
    check_dim("down", down, 3)
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("weights", weights, (torch.float32,))
    check_dtype("ids", ids, (torch.int64,))
    check_device(x=x, weights=weights, ids=ids, gate_up=gate_up, down=down)
    t, h = x.shape
    e, two_i, _ = gate_up.shape
    assert gate_up.dtype == down.dtype == x.dtype, f"gate_up/down dtypes {gate_up.dtype}/{down.dtype} != x's {x.dtype}"
    assert gate_up.shape[2] == h and tuple(down.shape) == (e, h, two_i // 2), (
        f"gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} do not fit x [T, {h}] "
        "(expected [E, 2I, H] and [E, H, I])")
    assert gate_up.is_contiguous() and down.is_contiguous(), "gate_up and down must be contiguous"
    assert x.stride(1) == 1, f"x must have unit stride in its last dim, strides {x.stride()}"
    assert weights.shape == ids.shape and ids.dim() == 2 and ids.shape[0] == t, (
        f"weights {tuple(weights.shape)} and ids {tuple(ids.shape)} must both be [T={t}, k]")
    k = ids.shape[1]
    if t == 0:
        return torch.zeros_like(x)
    pairs = t * k
    if gemv if gemv is not None else pairs <= GEMV_MAX_PAIRS:
        return experts_by_pair(x, weights, ids, gate_up, down)
    # big tiles once there are many rows an expert (measured on an H100, moe-probe-h100-2026-12-08-s30b.json)
    return experts_by_tile(x, weights, ids, gate_up, down, *((64, 128, 64, 3) if pairs >= 2048 else (16, 64, 128, 3)))


def experts_by_pair(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor) -> torch.Tensor:
    """moe_experts' gemv path (inputs checked by moe_experts)."""
    k = ids.shape[1]
    flat, scale = ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    return _gemv(_gemv(x, gate_up, flat, scale, k, True), down, flat, scale, k, False)


def experts_by_tile(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, block_m: int, block_n: int, block_k: int, stages: int) -> torch.Tensor:
    """moe_experts' tile path with its tile shape (inputs checked by moe_experts)."""
    (t, k), h = ids.shape, x.shape[1]
    rows, tile_expert = expert_tiles(ids, gate_up.shape[0], block_m)
    act = silu_and_mul(_tiled_gemm(x, gate_up, rows, tile_expert, t * k, k, block_m, block_n, block_k, stages))
    out = _tiled_gemm(act, down, rows, tile_expert, t * k, 1, block_m, block_n, block_k, stages)
    return (out.view(t, k, h).float() * weights[:, :, None]).sum(1).to(x.dtype)
