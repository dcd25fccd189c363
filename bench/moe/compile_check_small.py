"""Compile the decode MoE kernels (``triton_moe_small_kernels``) for sm_90 on a machine WITHOUT a GPU
and report registers per thread, spills, shared memory and the programs per SM they allow (65536
registers, ~227 KB shared memory, 128 threads per program). Uses Triton's bundled cuobjdump.

    PYTHONPATH=shared python bench/moe/compile_check_small.py

Each row: kernel, tiles (bm, bn, plan, maxnreg). Integer arguments that a real launch sees as
multiples of 16 (pointers, K, N, E, most strides) get the same divisibility hint here, so the loads
vectorise and pipeline as they do on the device.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

from dayzero.kernels import triton_moe_small_kernels as K

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
NOT_DIV16 = {"T", "n_tiles", "stride_se", "stride_sn", "cnt_total", "limit", "alpha", "offset"}
TYPES = {"x_ptr": "*bf16", "h_ptr": "*bf16", "ids_ptr": "*i64", "wt_ptr": "*bf16", "w_ptr": "*fp8e4nv",
         "s_ptr": "*fp32", "b_ptr": "*bf16", "y_ptr": "*fp32", "out_ptr": "*bf16", "cnt_ptr": "*i32",
         "slot_e_ptr": "*i32", "slot_cnt_ptr": "*i32", "slot_pairs_ptr": "*i32", "limit": "fp32", "alpha": "fp32"}


def check(kernel, bm: int, bn: int, plan: bool, maxnreg: int) -> dict:
    consts = dict(TOPK=4, TB=64, KP=4, EB=64, BM=bm, BN=bn, BK_=128, KBP=32, PLAN=plan, DOT_F32=False)
    if kernel is K.down_kernel:
        consts["FUSED"] = False
    sig = {n: ("constexpr" if n in consts else TYPES.get(n, "i32")) for n in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if n not in consts and n not in NOT_DIV16}
    opts = dict(num_warps=4, num_stages=4, **({"maxnreg": maxnreg} if maxnreg else {}))
    k = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(k.asm["cubin"])
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", cubin], capture_output=True, text=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    smem = k.metadata.shared + 1024  # + the per-program reserve
    per_sm = min(65536 // (128 * -(-regs // 8) * 8), 227 * 1024 // smem, 32)
    return dict(kernel=kernel.fn.__name__, bm=bm, bn=bn, plan=plan, maxnreg=maxnreg, regs=regs,
                local_ld_st=sass.count("LDL") + sass.count("STL"), smem=smem, programs_per_sm=per_sm,
                async_copies="LDGSTS" in sass)


def main() -> int:
    for kernel in (K.gate_up_kernel, K.down_kernel):
        for plan, maxnreg in ((False, 0), (False, 128), (True, 0), (True, 96)):
            print(check(kernel, 16, 32, plan, maxnreg), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
