"""Per-iteration SASS of the paged decode attention's main loop, compiled for sm_90 on any
machine (no GPU): Triton's bundled ptxas and nvdisasm (diagnostic).

    PYTHONPATH=DIR_WITH_TRITON_3.6:. python bench/sass_offline.py

Use the device's Triton version (3.6: `pip download triton==3.6.0`, `pip install --target DIR`):
other versions emit other code. Pointers and the strides that are multiples of 16 at run time
are marked so (Triton specializes them when it launches), so the loop body matches what runs:
for the fp8 kernel before 2026-12-04 it has 1,540 instructions per warp and 128-token tile,
where Nsight Compute counted ~1,590 executed on an H200 (bench/results/ncu-sass-h200-2026-12-04-s11.log).
Prints the largest loop body's length and its most frequent opcodes, per variant.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pdserve.kernels.decode_attention import _decode_kernel

DIV16 = {"stride_vn", "stride_vh", "stride_cn", "stride_cs", "stride_ch", "stride_qb", "stride_qh", "stride_ob", "stride_oh", "stride_sh",
         "stride_sn", "head_dim"}


def sass(fn, ptrs: dict[str, str], consts: dict, **opts) -> str:
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n == "scale_log2" else "i32") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if n not in consts and (n.endswith("_ptr") or n in DIV16)}
    kernel = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
        return subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout


def loop_body(text: str) -> list[str]:
    """The instructions of the largest backward branch's range (the main loop)."""
    labels, ins = {}, []
    for line in text.splitlines():
        if m := re.match(r"^\s*(\.L_x_\d+):", line):
            labels[m.group(1)] = len(ins)
        elif m := re.match(r"\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", line):
            ins.append(m.group(1))
    bodies = [ins[labels[m.group(1)]: i + 1] for i, t in enumerate(ins)
              if (m := re.search(r"BRA\s+`\((\.L_x_\d+)\)", t)) and labels.get(m.group(1), i + 1) <= i]
    return max(bodies, key=len, default=[])


def main() -> None:
    print(f"triton {triton.__version__}")
    ptrs = {"q_ptr": "*bf16", "kc_ptr": "*fp8e4nv", "vc_ptr": "*fp8e4nv", "ks_ptr": "*fp32", "vs_ptr": "*fp32",
            "bt_ptr": "*i32", "lens_ptr": "*i32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
            "kn_ptr": "*bf16", "vn_ptr": "*bf16", "pos_ptr": "*i32", "cs_ptr": "*fp32", "slot_ptr": "*i64"}
    base = {"G": 4, "G_PAD": 16, "S": 16, "D_PAD": 128, "SPLIT": False, "PRECISION": "tf32", "DOT_F32": False,
            "EVEN_D": True, "HEADS_FIRST": True, "PAIRS": False, "OFF32": False, "ROPE": False, "HALF": 1, "QMAX": 1.0}
    i8 = {**ptrs, "kc_ptr": "*i8", "vc_ptr": "*i8"}
    variants = {
        "fp8, K by bit moves (before 2026-12-04)": (ptrs, dict(BLOCK_N=128, QUANT=True, TILES=2, K_CVT=False)),
        "fp8, K by Triton's convert (before 2026-12-07)": (ptrs, dict(BLOCK_N=128, QUANT=True, TILES=2, K_CVT=True)),
        "fp8, byte pairs, 64-bit offsets": (ptrs, dict(BLOCK_N=128, QUANT=True, TILES=2, K_CVT=True, PAIRS=True)),
        "fp8, byte pairs, 32-bit offsets (default)": (ptrs, dict(BLOCK_N=128, QUANT=True, TILES=2, K_CVT=True,
                                                                 PAIRS=True, OFF32=True)),
        "int8, bytes (before 2026-12-07)": (i8, dict(BLOCK_N=128, QUANT=True, TILES=2, K_CVT=False, OFF32=True)),
        "int8, byte pairs, 32-bit offsets (default)": (i8, dict(BLOCK_N=128, QUANT=True, TILES=2, K_CVT=False,
                                                                 PAIRS=True, OFF32=True)),
        "bf16 (64-token tiles), 64-bit offsets (default)": ({**ptrs, "kc_ptr": "*bf16", "vc_ptr": "*bf16"},
                                                  dict(BLOCK_N=64, QUANT=False, TILES=1, K_CVT=False)),
        "bf16 (64-token tiles), 32-bit offsets (slower on an H100)": ({**ptrs, "kc_ptr": "*bf16", "vc_ptr": "*bf16"},
                                                            dict(BLOCK_N=64, QUANT=False, TILES=1, K_CVT=False,
                                                                 OFF32=True)),
    }
    for name, (p, extra) in variants.items():
        report(name, sass(_decode_kernel, p, {**base, **extra}, num_warps=4, num_stages=2))
    from fp8_dot_probe import _vt_kernel  # bench/ is on sys.path when run as a script

    for p8 in (True, False):
        consts = dict(G=4, G_PAD=16, S=16, D=128, BLOCK_N=128, INTERP=False, Q8=False, P8=p8)
        report(f"probe: V stored transposed, P {'rounded to fp8' if p8 else 'in fp16'}",
               sass(_vt_kernel, {**ptrs, "vt_ptr": "*fp8e4nv"}, consts, num_warps=4, num_stages=2))


def report(name: str, text: str, top: int = 12) -> None:
    body = loop_body(text)
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
    print(f"{name}: {len(body)} instructions per loop iteration; {dict(ops.most_common(top))}", flush=True)


if __name__ == "__main__":
    main()
