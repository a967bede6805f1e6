"""The Triton op namespace: one twin of every op in pdserve.kernels.reference, same names and signatures.

The model calls ops through a namespace (pdserve.kernels.reference on CPU, pdserve.kernels.triton_ops on
CUDA). Imports Triton at module import, so import this module only where Triton runs (CUDA,
or CPU with TRITON_INTERPRET=1). rope_cos_sin builds a table once and gather_kv is a debug
helper; both stay in plain torch.
"""

from __future__ import annotations

from pdserve.kernels.copy_blocks import copy_blocks
from pdserve.kernels.decode_attention import paged_decode_attention
from pdserve.kernels.decode_rotary_attention import decode_rotary_attention
from pdserve.kernels.fused_moe import moe_experts
from pdserve.kernels.gemv import linear, norm_glu, norm_linear
from pdserve.kernels.prefill_attention import paged_prefill_attention
from pdserve.kernels.moe_route import moe_route
from pdserve.kernels.reference import gather_kv, rope_cos_sin
from pdserve.kernels.rms_norm import rms_norm
from pdserve.kernels.rotary import rotary
from pdserve.kernels.rotary_write_kv import rotary_write_kv
from pdserve.kernels.silu_and_mul import silu_and_mul
from pdserve.kernels.write_kv import write_kv

__all__ = [
    "copy_blocks",
    "decode_rotary_attention",
    "gather_kv",
    "linear",
    "moe_experts",
    "moe_route",
    "norm_glu",
    "norm_linear",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "rope_cos_sin",
    "rotary",
    "rotary_write_kv",
    "silu_and_mul",
    "write_kv",
]
