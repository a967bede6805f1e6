"""Shared argument checks and small helpers for the Triton kernel wrappers.

Every wrapper checks its inputs before launch: a kernel fed a wrong stride or dtype
reads garbage silently, so the checks fail loudly with the argument's name instead.
"""

from __future__ import annotations

import functools
import os

import torch
import triton

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and that device CUDA unless the interpreter runs."""
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    for name, dev in devices.items():
        assert dev == first, f"{name} is on {dev}, expected {first} like the other inputs"
    if not interpreting():
        assert first.type == "cuda", (
            f"Triton kernels need CUDA tensors (got {first}); use kernels.reference on CPU "
            "or set TRITON_INTERPRET=1"
        )
    return first


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    """Assert t.dtype is one of `allowed`."""
    assert t.dtype in allowed, f"{name} has dtype {t.dtype}, expected one of {allowed}"


def check_dim(name: str, t: torch.Tensor, ndim: int) -> None:
    """Assert t has `ndim` dimensions."""
    assert t.dim() == ndim, f"{name} must be {ndim}-D, got shape {tuple(t.shape)}"


def check_last_contiguous(name: str, t: torch.Tensor) -> None:
    """Kernels index the last dim with unit stride; other strides are passed explicitly."""
    assert t.stride(-1) == 1 or t.shape[-1] == 1, (
        f"{name} must have unit stride in its last dim, strides {t.stride()}"
    )


def check_cache(name: str, cache: torch.Tensor) -> None:
    """A paged cache [N, S, Hk, D]: contiguous in its last 3 dims, any block stride."""
    check_dim(name, cache, 4)
    _, s, hk, d = cache.shape
    assert cache.stride()[1:] == (hk * d, d, 1), (
        f"{name} must be contiguous in its last 3 dims (slot, head, dim); "
        f"shape {tuple(cache.shape)} strides {cache.stride()}"
    )
    assert cache.stride(0) >= s * hk * d, f"{name} has overlapping blocks, strides {cache.stride()}"


def check_attention_inputs(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor
) -> tuple[int, int]:
    """Shared checks of the attention ops; returns (query heads per KV head, head dim)."""
    check_dim("q", q, 3)
    check_last_contiguous("q", q)
    check_dtype("q", q, FLOAT_DTYPES)
    check_cache("k_cache", k_cache)
    check_cache("v_cache", v_cache)
    assert k_cache.shape == v_cache.shape, (
        f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ"
    )
    assert k_cache.stride() == v_cache.stride(), "k_cache and v_cache strides differ"
    assert k_cache.dtype == v_cache.dtype == q.dtype, (
        f"q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
    )
    hq, d = q.shape[1], q.shape[2]
    hk = k_cache.shape[2]
    assert k_cache.shape[3] == d, f"head dim of q ({d}) != cache head dim ({k_cache.shape[3]})"
    assert hq % hk == 0, f"query heads ({hq}) must be a multiple of KV heads ({hk})"
    check_dim("block_tables", block_tables, 2)
    check_dtype("block_tables", block_tables, (torch.int32,))
    check_last_contiguous("block_tables", block_tables)
    return hq // hk, d


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1)."""
    return triton.next_power_of_2(max(int(n), 1))


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (a fixed small number in the interpreter)."""
    if interpreting() or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get full-precision dots (tf32 would break the 1e-4 contract)."""
    return "ieee" if dtype == torch.float32 else "tf32"
