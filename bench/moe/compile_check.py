"""Compile the large-M MoE GEMM for sm_90 on a machine WITHOUT a GPU and report what decides its speed:
registers per thread, shared memory, spills (local loads/stores in SASS), wgmma instructions and
ptxas' wgmma-serialisation warnings (C7514/C7515). Uses Triton's bundled ptxas and cuobjdump.

    PYTHONPATH=shared python bench/moe/compile_check.py gate_up:64:256:1:8:3 down:64:128:1:4:3 \
        [--rescale] [--pipe] [--persistent] [--dump DIR]

Each spec is GEMM:BM:BN:SPLIT_N:WARPS:STAGES. Programs per SM follow from the numbers: 65536
registers and ~227 KB shared memory per SM (bench/NOTES.md, MoE runs 5-8 used this before each run).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

from dayzero.kernels.triton_moe_gemm_large import moe_gemm_large_kernel as KERNEL

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def signature(epi: int, bm: int, bns: int) -> dict:
    sig = {name: "i32" for name in KERNEL.arg_names}
    sig.update(a_desc=f"tensordesc<fp8e4nv[{bm}, 128]>", b_desc=f"tensordesc<fp8e4nv[1, {bns}, 128]>",
               as_ptr="*fp32", bs_ptr="*fp32", bias_ptr="*bf16", c_ptr="*fp8e4nv" if epi == 1 else "*bf16",
               cs_ptr="*fp32", sorted_ids_ptr="*i32", block_expert_ptr="*i32", weights_ptr="*bf16",
               limit="fp32", alpha="fp32")
    return sig


def check(spec: str, rescale: bool, pipe: bool, persistent: bool, dump: str | None) -> dict:
    gemm, bm, bn, split, warps, stages = spec.split(":")
    epi = 1 if gemm == "gate_up" else 2
    bm, bn, split, warps, stages = int(bm), int(bn), int(split), int(warps), int(stages)
    consts = dict(EPI=epi, SPLIT_N=split, BM=bm, BN=bn, BK=128, GROUP_M=16, PERSISTENT=persistent, NUM_PROGS=132,
                  FLATTEN=persistent, RESCALE=rescale, PIPE=pipe, DOT_F32=False)
    sig = signature(epi, bm, bn // split)
    sig.update({k: "constexpr" for k in consts})
    k = triton.compile(ASTSource(KERNEL, sig, consts), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages))
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(ptx, "w") as f:
            f.write(k.asm["ptx"])
        ptxas = subprocess.run([os.path.join(BIN, "ptxas"), "-arch=sm_90a", "-v", ptx, "-o", cubin],
                               capture_output=True, text=True).stderr
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
    if dump:
        os.makedirs(dump, exist_ok=True)
        for ext, text in (("ttgir", k.asm["ttgir"]), ("ptx", k.asm["ptx"]), ("sass", sass)):
            with open(os.path.join(dump, f"{spec.replace(':', '_')}.{ext}"), "w") as f:
                f.write(text)
    regs = int(re.search(r"Used (\d+) registers", ptxas).group(1))
    threads = 32 * warps
    by_regs = 65536 // (threads * ((regs + 7) // 8 * 8))
    by_smem = (227 * 1024) // (k.metadata.shared + 1024)
    return dict(spec=spec, regs=regs, smem_kb=round(k.metadata.shared / 1024, 1), programs_per_sm=min(by_regs, by_smem),
                spill_ldl_stl=sass.count("LDL") + sass.count("STL"), qgmma=sass.count("QGMMA"),
                wgmma_serialised=bool(re.search(r"C751[45]", ptxas)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+", help="GEMM:BM:BN:SPLIT_N:WARPS:STAGES, GEMM = gate_up | down")
    ap.add_argument("--rescale", action="store_true")
    ap.add_argument("--pipe", action="store_true")
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--dump", default=None, help="write TTGIR / PTX / SASS here")
    args = ap.parse_args()
    for spec in args.specs:
        print(check(spec, args.rescale, args.pipe, args.persistent, args.dump), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
