"""Single-row linear layer y = x @ W^T (+ b) (Triton twin of reference.linear at one token),
optionally fused with the RMSNorm before it (reference.norm_linear).

Batch-1 decode is a chain of matrix-vector products: every weight byte is read once and used
once, so the op is bound by memory bandwidth. cuBLAS picks split-K tiles for the narrow ones
(o, down) and pays a second reduction kernel. Here each program owns BLOCK_N output rows,
streams their whole reduction dim in BLOCK_K chunks into an fp32 register tile and reduces
it once at the end: one kernel, no workspace.

The input row is tiny (a few KB) next to the weights, so every program can rebuild it from
the RMSNorm's inputs instead of reading a separate kernel's output (program 0 also stores the
residual sum): a launch and its gap fewer, which at batch 1 cost as much as the norm kernel.
The norm is folded in one pass, y = W (x * g) / rms(x), its sum of squares accumulated beside
the dot product (a first pass for the rms kept each program from its first weight load), so
the normed row is not rounded to x's dtype as the separate kernel rounds it: the fused result
is the more precise one. On an H200 the fusion made a Llama-3.1-8B batch-1 step 5 % faster;
the same fusion of the SiLU-and-mul into the down projection made it slower (every program
recomputed the whole activation), and launching the gemv with programmatic dependent launch
changed nothing, or made the step 2 % slower when the gemv read its first weight tile before
waiting for the kernel ahead (bench/ab_decode.py, bench/results/ab-decode-h200-2026-12-03-s8.json
and -s8d.json), so none of those is here. The SiLU-and-mul is instead the gate_up gemv's
epilogue (GLU: a program's rows are half gate, half the matching up rows), which cost nothing
and saved a launch per layer (0.3-1.2 %, ab-decode-glu-h200-2026-12-04-s9.json).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdserve.kernels._common import FLOAT_DTYPES, check_device, check_dim, check_dtype
from pdserve.kernels._common import check_last_contiguous, interpreting, next_pow2
from pdserve.kernels.rms_norm import rms_norm
from pdserve.kernels.silu_and_mul import silu_and_mul


@triton.jit
def _load(ptr, k, kmask, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(ptr + k)
    else:
        return tl.load(ptr + k, mask=kmask, other=0.0)


@triton.jit
def _prefetch_l2(ptrs, live):
    """Ask L2 for the 128-byte lines at ptrs where live (no registers filled, nothing waits
    for them)."""
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\t@p prefetch.global.L2::evict_last [$1];\n\t"
        "mov.u32 $0, 0;\n\t}", "=r,l,r", [ptrs, live.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def weight_rows(pid, n_out, BLOCK_N: tl.constexpr, GLU: tl.constexpr):
    """The BLOCK_N weight rows program pid reads, and which are real: BLOCK_N consecutive rows,
    or (GLU, a [gate; up] weight of 2 * n_out rows) BLOCK_N / 2 gate rows and their up rows."""
    if GLU:
        j = tl.arange(0, BLOCK_N)
        o = pid * (BLOCK_N // 2) + j % (BLOCK_N // 2)
        nmask = o < n_out
        n = o + (j // (BLOCK_N // 2)) * n_out
    else:
        n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < n_out
    return n, nmask


@triton.jit
def store_rows(out_ptr, y, n, nmask, pid, n_out, BLOCK_N: tl.constexpr, GLU: tl.constexpr):
    """Store the rows' results y (fp32) at out_ptr; GLU: silu(gate) * up, BLOCK_N / 2 outputs."""
    if GLU:
        gate, up = tl.split(tl.trans(tl.reshape(y, [2, BLOCK_N // 2])))
        o = pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        act = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + o, act.to(out_ptr.dtype.element_ty), mask=o < n_out)
    else:
        tl.store(out_ptr + n, y.to(out_ptr.dtype.element_ty), mask=nmask)


@triton.jit(do_not_specialize=["pf_lines", "pf_per"])  # a variant per prefetch size otherwise
def _gemv_kernel(
    x_ptr, r_ptr, g_ptr, sum_ptr, w_ptr, b_ptr, out_ptr, pf_ptr, n_out, k_in, stride_w, eps, pf_lines, pf_per,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr, HAS_RES: tl.constexpr, PF_LINES: tl.constexpr, GLU: tl.constexpr,
):
    pid = tl.program_id(0)
    n, nmask = weight_rows(pid, n_out, BLOCK_N, GLU)
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_w
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    ss = tl.zeros([BLOCK_K], tl.float32)  # NORM: the row's sum of squares, in the same pass
    for k0 in range(0, k_in, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < k_in
        x = _load(x_ptr, k, kmask, EVEN_K)
        if HAS_RES:  # the sum rounded to x's dtype, like reference.rms_norm's
            x = (x.to(tl.float32) + _load(r_ptr, k, kmask, EVEN_K).to(tl.float32)).to(x.dtype)
            tl.store(sum_ptr + k, x, mask=kmask & (tl.zeros_like(k) + pid == 0))
        xf = x.to(tl.float32)
        if NORM:  # (x + r) * g; the 1/rms is one factor per row, applied at the end
            ss += xf * xf
            xf *= _load(g_ptr, k, kmask, EVEN_K).to(tl.float32)
        if EVEN_K:
            w = tl.load(rows + k[None, :], mask=nmask[:, None], other=0.0)
        else:
            w = tl.load(rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        acc += w.to(tl.float32) * xf[None, :]
    y = tl.sum(acc, 1)
    if NORM:
        y *= tl.rsqrt(tl.sum(ss, 0) / k_in + eps)
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    store_rows(out_ptr, y, n, nmask, pid, n_out, BLOCK_N, GLU)
    if PF_LINES > 0:  # warm L2 with the start of the next projection's weights: its ramp
        i = tl.arange(0, PF_LINES)  # pf_per <= PF_LINES lines each, every line once
        line = pid * pf_per + i
        _prefetch_l2(pf_ptr + line.to(tl.int64) * 128, (i < pf_per) & (line < pf_lines))


def _check_row(x: torch.Tensor) -> None:
    check_dim("x", x, 2)
    check_dtype("x", x, FLOAT_DTYPES)
    assert x.shape[0] == 1, f"gemv takes one row, x has {x.shape[0]}"
    check_last_contiguous("x", x)


def _launch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
    residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
    summed: torch.Tensor | None = None, eps: float = 0.0, *, block_n: int, block_k: int, num_warps: int,
    prefetch: torch.Tensor | None = None, glu: bool = False,
) -> torch.Tensor:
    """Check the weight and knobs, and run the kernel over the row x (normed with norm_weight);
    at its end the programs ask L2 for the first PREFETCH_BYTES of `prefetch` (CUDA only).
    glu: the weight is [gate; up] (2I rows) and the result silu(gate) * up [1, I]."""
    check_dim("weight", weight, 2)
    check_last_contiguous("weight", weight)
    assert weight.dtype == x.dtype, f"weight dtype {weight.dtype} != x dtype {x.dtype}"
    n, k = weight.shape
    assert x.shape[1] == k, f"x has {x.shape[1]} features, weight expects {k}"
    if bias is not None:
        check_dim("bias", bias, 1)
        assert bias.shape[0] == n and bias.is_contiguous(), f"bias must be contiguous [{n}]"
        check_device(x=x, weight=weight, bias=bias)
    else:
        check_device(x=x, weight=weight)
    for name, v in (("block_n", block_n), ("block_k", block_k)):
        assert v >= 1 and v & (v - 1) == 0, f"{name} {v} must be a power of two"
    if glu:
        assert n % 2 == 0, f"a gate/up weight has an even row count, got {n}"
        assert block_n >= 2, f"glu needs block_n >= 2 (a gate and an up row), got {block_n}"
    n_out = n // 2 if glu else n
    out = torch.empty((1, n_out), dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    grid = triton.cdiv(n_out, block_n // 2 if glu else block_n)
    pf, pf_lines, per_program = _prefetch_plan(prefetch, x.device, grid)
    _gemv_kernel[(grid,)](
        x, residual if residual is not None else x, norm_weight if norm_weight is not None else x,
        summed if summed is not None else x, weight, bias if bias is not None else weight, out,
        pf if pf is not None else out, n_out, k, weight.stride(0), float(eps), pf_lines, per_program,
        BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0, HAS_BIAS=bias is not None,
        NORM=norm_weight is not None, HAS_RES=residual is not None,
        PF_LINES=next_pow2(per_program) if per_program else 0, GLU=glu, num_warps=num_warps,
    )
    return out


# ~1 us of HBM reads at 4 TB/s, about a gemv kernel's ramp-up: 4 MiB beat 8 and 16 on an H200
# (batch-1 step 4.670 ms vs 4.706 without on Llama-3.1-8B, 4.548 vs 4.697 on Qwen2.5-7B;
# bench/results/branches-h200-2026-12-04-s9.log). The qkv gemv warming 8/16/32 MiB of o, through
# the attention between them, was even or slower on an H100 (6.122/6.184/6.255 ms per step vs
# 6.147 at 128 ctx, 6.410/6.470/6.590 vs 6.377 at 4k; ab-decode-pf-attn-h100-2026-12-07-s23b-*.json,
# from 802aa16) and was not kept.
PREFETCH_BYTES = 4 << 20


def _prefetch_plan(prefetch: torch.Tensor | None, device: torch.device, grid: int
                   ) -> tuple[torch.Tensor | None, int, int]:
    """(bytes view, lines to prefetch, lines per program; 0: none) for `prefetch`'s first
    PREFETCH_BYTES, each line asked for once (before 2026-12-07 the lines per program were
    rounded up to a power of two and programs past the budget re-asked for its last line).
    Off in the interpreter (no PTX) and for tensors elsewhere."""
    if (prefetch is None or PREFETCH_BYTES <= 0 or interpreting() or not prefetch.is_contiguous()
            or prefetch.device != device or prefetch.numel() == 0):
        return None, 1, 0
    flat = prefetch.reshape(-1).view(torch.uint8)
    lines = triton.cdiv(min(flat.numel(), PREFETCH_BYTES), 128)
    return flat, lines, triton.cdiv(lines, grid)


def gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    *, block_n: int = 8, block_k: int = 512, num_warps: int = 4, prefetch: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [1, K] @ weight[N, K]^T (+ bias [N]) -> [1, N] in x's dtype, fp32 accumulation.

    block_n (output rows per program) and block_k (reduction chunk), powers of two, and
    num_warps are tuning knobs; `prefetch` (the next kernel's weight) gets its start into L2."""
    _check_row(x)
    return _launch(x, weight, bias, block_n=block_n, block_k=block_k, num_warps=num_warps, prefetch=prefetch)


def norm_gemv(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
    weight: torch.Tensor, bias: torch.Tensor | None = None,
    *, block_n: int = 8, block_k: int = 512, num_warps: int = 4, prefetch: torch.Tensor | None = None,
    glu: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm then gemv in one kernel: (gemv(norm(x + residual) * norm_weight), x + residual);
    without a residual the second result is x itself (as in reference.rms_norm). glu: the
    weight is [gate; up] and the first result silu(gate) * up (reference.norm_glu)."""
    _check_row(x)
    k = x.shape[1]
    check_dim("norm_weight", norm_weight, 1)
    check_dtype("norm_weight", norm_weight, FLOAT_DTYPES)
    assert norm_weight.shape[0] == k and norm_weight.is_contiguous(), (
        f"norm_weight must be contiguous [{k}], got {tuple(norm_weight.shape)}")
    summed = x
    if residual is not None:
        assert residual.shape == x.shape, f"residual {tuple(residual.shape)} != x {tuple(x.shape)}"
        assert residual.dtype == x.dtype, f"residual dtype {residual.dtype} != x dtype {x.dtype}"
        check_last_contiguous("residual", residual)
        check_device(x=x, residual=residual, norm_weight=norm_weight)
        summed = torch.empty((1, k), dtype=x.dtype, device=x.device)
    else:
        check_device(x=x, norm_weight=norm_weight)
    out = _launch(x, weight, bias, residual, norm_weight, summed, eps,
                  block_n=block_n, block_k=block_k, num_warps=num_warps, prefetch=prefetch, glu=glu)
    if residual is not None and weight.shape[0] == 0:  # no program ran to store the sum
        summed.copy_(x + residual)
    return out, summed


def gemv_tiles(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps) for an [N, K] weight: the best of a sweep on an H200
    (bench/results/bs1-probe-h200-2026-12-03-s7.json) for Llama-3.1-8B's five shapes."""
    if k >= 8192:
        return 16, 1024, 8
    if n >= 16384:
        return 16, 256, 4
    return 8, 512, 4


def _one_row(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when gemv serves x @ weight^T: one contiguous bf16/fp16 row (batch-1 decode)."""
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and x.stride(-1) == 1 and weight.stride(-1) == 1)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           prefetch: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through gemv when x is one contiguous bf16/fp16 row (batch-1 decode); then
    `prefetch` (the next projection's weight) is warmed into L2 at the kernel's end."""
    if _one_row(x, weight):
        bn, bk, warps = gemv_tiles(*weight.shape)
        return gemv(x, weight, bias, block_n=bn, block_k=bk, num_warps=warps, prefetch=prefetch)
    return torch.nn.functional.linear(x, weight, bias)


def norm_linear(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
    weight: torch.Tensor, bias: torch.Tensor | None = None, prefetch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.norm_linear: one fused kernel for a batch-1 row, else rms_norm and F.linear."""
    if _one_row(x, weight) and (residual is None or residual.stride(-1) == 1):
        bn, bk, warps = gemv_tiles(*weight.shape)
        return norm_gemv(x, norm_weight, eps, residual, weight, bias,
                         block_n=bn, block_k=bk, num_warps=warps, prefetch=prefetch)
    normed, summed = rms_norm(x, norm_weight, eps, residual)
    return torch.nn.functional.linear(normed, weight, bias), summed


def norm_glu(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
    weight: torch.Tensor, bias: torch.Tensor | None = None, prefetch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.norm_glu: one fused kernel for a batch-1 row (norm, gate/up gemv, SiLU-and-mul:
    the [1, 2I] gate_up row is never written), else rms_norm, F.linear and silu_and_mul."""
    if _one_row(x, weight) and (residual is None or residual.stride(-1) == 1):
        bn, bk, warps = gemv_tiles(*weight.shape)
        return norm_gemv(x, norm_weight, eps, residual, weight, bias, block_n=bn, block_k=bk,
                         num_warps=warps, prefetch=prefetch, glu=True)
    out, summed = norm_linear(x, norm_weight, eps, residual, weight, bias)
    return silu_and_mul(out), summed
