"""Shared argument checks and small helpers for the Triton kernel wrappers.

Every wrapper checks its inputs before launch: a kernel fed a wrong stride or dtype
reads garbage silently, so the checks fail loudly with the argument's name instead.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil

import torch
import triton

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def launchable_kernels() -> dict[str, object]:
    """Every kernel of pdserve.kernels (the `_*_kernel` functions, not device helpers), by
    "module.name": Triton JITFunctions, or InterpretedFunctions under the interpreter."""
    package = importlib.import_module("pdserve.kernels")
    found: dict[str, object] = {}
    for info in pkgutil.iter_modules(package.__path__):
        mod = importlib.import_module(f"pdserve.kernels.{info.name}")
        for name, obj in vars(mod).items():
            fn = getattr(obj, "fn", None)
            if name.startswith("_") and name.endswith("_kernel") and getattr(fn, "__module__", None) == mod.__name__:
                found[f"{info.name}.{name}"] = obj
    return found


def check_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and that device CUDA unless the interpreter runs."""
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    for name, dev in devices.items():
        assert dev == first, f"{name} is on {dev}, expected {first} like the other inputs"
    if not interpreting():
        assert first.type == "cuda", (
            f"Triton kernels need CUDA tensors (got {first}); use pdserve.kernels.reference on CPU "
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


def check_row_vector(name: str, t: torch.Tensor, rows: int, allowed: tuple[torch.dtype, ...]) -> None:
    """A per-row parameter: a contiguous 1-D tensor of `rows` elements of an allowed dtype."""
    check_dim(name, t, 1)
    check_dtype(name, t, allowed)
    assert t.shape[0] == rows and t.is_contiguous(), f"{name} must be a contiguous [{rows}] tensor"


QUANT_DTYPES = (torch.float8_e4m3fn, torch.int8)


def check_cache(name: str, cache: torch.Tensor) -> None:
    """A paged cache [N, S, Hk, D]: unit dim stride; within a block either slot-major (heads of
    a slot packed, row stride >= D: a quantized pool's rows may carry their scale after the D
    values) or head-major (a head's S rows packed, stride(1) the row); any block stride."""
    check_dim(name, cache, 4)
    _, s, hk, d = cache.shape
    slot_major = cache.stride(1) == hk * cache.stride(2)
    row = cache.stride(2) if slot_major else cache.stride(1)
    assert cache.stride(3) == 1 and row >= d and (slot_major or cache.stride(2) == s * row), (
        f"{name} must be packed in its last 3 dims (slot, head, dim or head, slot, dim); "
        f"shape {tuple(cache.shape)} strides {cache.stride()}"
    )
    assert cache.stride(0) >= s * hk * row, f"{name} has overlapping blocks, strides {cache.stride()}"


def check_scales(
    k_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
) -> bool:
    """Scales of a quantized cache: both or neither, float32 [N, S, Hk]; True if quantized."""
    if k_scale is None and v_scale is None:
        return False
    assert k_scale is not None and v_scale is not None, "pass both k_scale and v_scale or neither"
    check_dtype("k_cache", k_cache, QUANT_DTYPES)
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        check_dtype(name, sc, (torch.float32,))
        assert tuple(sc.shape) == tuple(k_cache.shape[:3]), (
            f"{name} shape {tuple(sc.shape)} != cache (N, S, Hk) {tuple(k_cache.shape[:3])}"
        )
    assert k_scale.stride() == v_scale.stride(), "k_scale and v_scale strides differ"
    return True


def check_attention_inputs(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    quantized: bool = False,
) -> tuple[int, int]:
    """Shared checks of the attention ops; returns (query heads per KV head, head dim).

    A quantized cache (fp8/int8, see check_scales) may differ in dtype from q."""
    check_dim("q", q, 3)
    check_last_contiguous("q", q)
    check_dtype("q", q, FLOAT_DTYPES)
    check_cache("k_cache", k_cache)
    check_cache("v_cache", v_cache)
    assert k_cache.shape == v_cache.shape, (
        f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ"
    )
    assert k_cache.stride() == v_cache.stride(), "k_cache and v_cache strides differ"
    assert k_cache.dtype == v_cache.dtype and (quantized or k_cache.dtype == q.dtype), (
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
