"""Compile every Triton kernel for an sm_90 target ahead of time, without a GPU.

The interpreter skips Triton's real code generator, so type errors of loop-carried values,
constexpr specialization or layout problems only show on a GPU. Triton compiles to PTX with
its bundled ptxas and no driver, so this script (run with TRITON_INTERPRET unset, as a
subprocess of test_compile_sm90.py) catches them on CPU machines. Prints one line per kernel.
"""

from __future__ import annotations

import os

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run with TRITON_INTERPRET unset"

from pdserve.kernels.decode_attention import _decode_kernel, _merge_kernel  # noqa: E402
from pdserve.kernels.fused_moe import _expert_tiles_kernel, _moe_gemm_kernel, _moe_gemv_kernel  # noqa: E402
from pdserve.kernels.gemv import _gemv_kernel  # noqa: E402
from pdserve.kernels.moe_route import _moe_route_kernel  # noqa: E402
from pdserve.kernels.nucleus import _nucleus_kernel  # noqa: E402
from pdserve.kernels.penalties import _penalties_kernel  # noqa: E402
from pdserve.kernels.prefill_attention import _prefill_kernel  # noqa: E402
from pdserve.kernels.rms_norm import _rms_norm_kernel  # noqa: E402
from pdserve.kernels.copy_blocks import _copy_blocks_kernel  # noqa: E402
from pdserve.kernels.rotary import _rotary_kernel  # noqa: E402
from pdserve.kernels.rotary_write_kv import _rotary_write_kv_kernel  # noqa: E402
from pdserve.kernels.sample import _sample_kernel  # noqa: E402
from pdserve.kernels.sample_temperature import _chunk_kernel, _pick_kernel  # noqa: E402
from pdserve.kernels.silu_and_mul import _silu_and_mul_kernel  # noqa: E402
from pdserve.kernels.write_kv import _write_kv_kernel  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
FLOATS = ("eps", "scale_log2")


def compile_kernel(fn: triton.JITFunction, ptrs: dict[str, str], consts: dict, **opts: int) -> None:
    """Compile fn to PTX; unnamed arguments are i32 scalars (fp32 for FLOATS)."""
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        else:
            sig[name] = ptrs.get(name, "fp32" if name in FLOATS else "i32")
    kernel = triton.compile(ASTSource(fn, sig, consts), target=TARGET, options=opts)
    assert kernel.asm["ptx"], fn.__name__
    print(f"ok {fn.__name__} {consts}")


SCALES = {"ks_ptr": "*fp32", "vs_ptr": "*fp32"}
NO_ROPE = {"PAIRS": False, "OFF32": False, "ROPE": False, "HALF": 1, "QMAX": 1.0}  # the decode kernel's defaults


def attention(dt: str, cache_dt: str) -> None:
    """Decode (split and not, G = 1, 4, 7) and prefill (incl. num_seqs specialized to 1)."""
    quant = cache_dt != dt
    cache = {"q_ptr": f"*{dt}", "kc_ptr": f"*{cache_dt}", "vc_ptr": f"*{cache_dt}",
             "bt_ptr": "*i32", "lens_ptr": "*i32", **SCALES}
    for group, split in ((4, True), (7, False), (1, True)):
        ptrs = {**cache, "out_ptr": "*fp32" if split else f"*{dt}", "lse_ptr": "*fp32"}
        compile_kernel(_decode_kernel, ptrs, {
            "G": group, "G_PAD": 16, "S": 16, "D_PAD": 128, "BLOCK_N": 64,
            "SPLIT": split, "PRECISION": "tf32", "DOT_F32": False,
            "QUANT": quant, "EVEN_D": group != 7, "TILES": 2 if quant else 1,
            "K_CVT": cache_dt == "fp8e4nv", **NO_ROPE, "OFF32": group == 4,
        }, num_warps=4, num_stages=2)
    if quant:  # byte pairs (the default over fp8 and int8), split and not, an odd head dim
        for group, split, even_d in ((4, True, True), (7, False, False)):
            compile_kernel(_decode_kernel, {**cache, "out_ptr": "*fp32" if split else f"*{dt}", "lse_ptr": "*fp32"}, {
                "G": group, "G_PAD": 16, "S": 16, "D_PAD": 128, "BLOCK_N": 128, "SPLIT": split, "PRECISION": "tf32",
                "DOT_F32": False, "QUANT": True, "EVEN_D": even_d, "TILES": 2, "K_CVT": cache_dt == "fp8e4nv",
                **NO_ROPE, "PAIRS": True, "OFF32": split}, num_warps=4, num_stages=2)
    if cache_dt == "fp8e4nv":  # a head dim of 16 with K through Triton's convert
        compile_kernel(_decode_kernel, {**cache, "out_ptr": f"*{dt}", "lse_ptr": "*fp32"}, {
            "G": 4, "G_PAD": 16, "S": 16, "D_PAD": 16, "BLOCK_N": 128, "SPLIT": False, "PRECISION": "tf32",
            "DOT_F32": False, "QUANT": True, "EVEN_D": True, "TILES": 2, "K_CVT": True, **NO_ROPE,
        }, num_warps=4, num_stages=2)
    rope_ptrs = {**cache, "out_ptr": "*fp32", "lse_ptr": "*fp32", "kn_ptr": f"*{dt}", "vn_ptr": f"*{dt}",
                 "pos_ptr": "*i32", "cs_ptr": "*fp32", "slot_ptr": "*i32"}
    for pairs in (False, True) if quant else (False,):
        compile_kernel(_decode_kernel, rope_ptrs, {  # rotary + KV write inside (decode_rotary_attention)
            "G": 4, "G_PAD": 16, "S": 16, "D_PAD": 128, "BLOCK_N": 128 if quant else 64, "SPLIT": True,
            "PRECISION": "tf32", "DOT_F32": False, "QUANT": quant, "EVEN_D": True, "TILES": 2 if quant else 1,
            "K_CVT": cache_dt == "fp8e4nv", "PAIRS": pairs, "OFF32": True, "ROPE": True, "HALF": 64,
            "QMAX": {"fp8e4nv": 448.0, "i8": 127.0}.get(cache_dt, 1.0),
        }, num_warps=4, num_stages=2)
    compile_kernel(_merge_kernel, {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": f"*{dt}"},
                   {"P_PAD": 4, "D_PAD": 128})
    for group, bm, bn, warps in ((4, 128, 64, 8), (7, 128, 64, 8), (1, 64, 32, 4)):
        consts = {"G": group, "S": 16, "D_PAD": 128, "BLOCK_Q": bm // group,
                  "BLOCK_M": bm, "BLOCK_N": bn, "PRECISION": "tf32", "DOT_F32": False,
                  "QUANT": quant}
        if group == 1:
            consts["num_seqs"] = 1  # Triton specializes integer arguments equal to 1
        ptrs = {**cache, "qsl_ptr": "*i32", "out_ptr": f"*{dt}"}
        compile_kernel(_prefill_kernel, ptrs, consts, num_warps=warps, num_stages=2)


def elementwise(dt: str) -> None:
    """rms_norm, silu_and_mul, rotary (with a pass-through tail), write_kv."""
    ptrs = {p: f"*{dt}" for p in ("x_ptr", "res_ptr", "w_ptr", "out_ptr", "sum_ptr")}
    compile_kernel(_rms_norm_kernel, ptrs, {"HAS_RES": True, "BLOCK": 4096}, num_warps=16)
    compile_kernel(_silu_and_mul_kernel, {"x_ptr": f"*{dt}", "out_ptr": f"*{dt}"}, {"BLOCK": 1024})
    ptrs = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "qo_ptr": f"*{dt}", "ko_ptr": f"*{dt}",
            "pos_ptr": "*i64", "cs_ptr": "*fp32"}
    compile_kernel(_rotary_kernel, ptrs, {"HALF": 32, "BLOCK_HQ": 32, "BLOCK_HK": 8, "BLOCK_D": 128})
    gemv_ptrs = {p: f"*{dt}" for p in ("x_ptr", "r_ptr", "g_ptr", "sum_ptr", "w_ptr", "b_ptr", "out_ptr")}
    gemv_ptrs["pf_ptr"] = "*u8"
    for even_k, bias, norm, res, pf, glu in ((True, False, False, False, 128, False), (False, True, False, False, 0, False),
                                             (True, False, True, True, 64, False), (False, True, True, False, 0, False),
                                             (True, False, True, True, 64, True)):
        compile_kernel(_gemv_kernel, gemv_ptrs, {"BLOCK_N": 16 if glu else 8, "BLOCK_K": 512, "EVEN_K": even_k,
                                                 "HAS_BIAS": bias, "NORM": norm, "HAS_RES": res, "PF_LINES": pf,
                                                 "GLU": glu})
    compile_kernel(_nucleus_kernel, {"x_ptr": f"*{dt}", "temp_ptr": "*fp32", "k_ptr": "*i64", "p_ptr": "*fp32",
                                     "out_ptr": "*fp32"}, {"BLOCK": 1024, "NC": 16}, num_warps=8)
    draw_ptrs = {"x_ptr": f"*{dt}", "temp_ptr": "*fp32", "seed_ptr": "*i64"}
    for record in (False, True):
        compile_kernel(_sample_kernel, {**draw_ptrs, "p_ptr": "*fp32", "out_ptr": "*i64", "rounds_ptr": "*i32"},
                       {"BLOCK": 4096, "MAX_R": 64, "RECORD": record}, num_warps=16)
    compile_kernel(_chunk_kernel, {**draw_ptrs, "best_ptr": "*fp32", "arg_ptr": "*i32"}, {"BLOCK": 1024})
    compile_kernel(_pick_kernel, {"best_ptr": "*fp32", "arg_ptr": "*i32", "out_ptr": "*i64"}, {"C_PAD": 128},
                   num_warps=1)
    compile_kernel(_penalties_kernel, {"x_ptr": f"*{dt}", "out_ptr": f"*{dt}", "rows_ptr": "*i64", "slots_ptr": "*i64",
                                       "counts_ptr": "*fp32", "prompt_ptr": "*u8", "rep_ptr": "*fp32",
                                       "freq_ptr": "*fp32", "pres_ptr": "*fp32"}, {"BLOCK": 2048})
    for a_div in (8, 1):  # the gate_up product (a token's row per pair) and the down product
        compile_kernel(_moe_gemm_kernel, {"a_ptr": f"*{dt}", "w_ptr": f"*{dt}", "c_ptr": f"*{dt}", "rows_ptr": "*i32",
                                          "tile_expert_ptr": "*i32"},
                       {"A_DIV": a_div, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "PRECISION": "tf32",
                        "DOT_F32": False})
        glu = a_div != 1
        compile_kernel(_moe_gemv_kernel, {"a_ptr": f"*{dt}", "w_ptr": f"*{dt}", "c_ptr": f"*{dt}", "ids_ptr": "*i64",
                                          "scale_ptr": "*fp32"},
                       {"A_DIV": a_div, "PAIRS": 1 if glu else 8, "GLU": glu, "SCALE": not glu,
                        "BLOCK_N": 16 if glu else 8, "BLOCK_K": 512})
    compile_kernel(_expert_tiles_kernel, {"ids_ptr": "*i64", "rows_ptr": "*i32", "tile_expert_ptr": "*i32"},
                   {"BLOCK_M": 16, "BLOCK_E": 128, "BLOCK": 64, "BLOCK_T": 64}, num_warps=8)
    compile_kernel(_moe_route_kernel, {"logits_ptr": f"*{dt}", "w_ptr": "*fp32", "ids_ptr": "*i64"},
                   {"TOP_K": 8, "K_PAD": 8, "RENORM": True, "BLOCK_E": 128}, num_warps=1)
    compile_kernel(_copy_blocks_kernel, {p: "*i32" for p in ("src_ptr", "dst_ptr", "src_ids_ptr", "dst_ids_ptr")},
                   {"BLOCK": 2048})
    for cache_dt, qmax, is_int in ((dt, 1.0, False), ("fp8e4nv", 448.0, False), ("i8", 127.0, True)):
        ptrs = {"k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "kc_ptr": f"*{cache_dt}",
                "vc_ptr": f"*{cache_dt}", "slot_ptr": "*i64", **SCALES}
        consts = {"S": 16, "QUANT": cache_dt != dt, "QMAX": qmax, "IS_INT": is_int, "BLOCK_D": 128}
        compile_kernel(_write_kv_kernel, ptrs, {**consts, "BLOCK_H": 8})
        ptrs |= {"q_ptr": f"*{dt}", "qo_ptr": f"*{dt}", "pos_ptr": "*i64", "cs_ptr": "*fp32"}
        compile_kernel(_rotary_write_kv_kernel, ptrs, {**consts, "HALF": 64, "BLOCK_HQ": 32, "BLOCK_HK": 8})


if __name__ == "__main__":
    elementwise("bf16")
    attention("bf16", "bf16")
    attention("bf16", "fp8e4nv")
    attention("bf16", "i8")
