"""sm_90 build of the TMA decode candidate (triton_attention_decode_tma.py) on a machine WITHOUT a GPU:
registers, spills, shared memory, programs per SM, whether the pages arrive by TMA (UTMALDG) and the pipeline
(mbarrier waits), beside the shipped split kernel's digest (which must not change).

    PYTHONPATH=shared python bench/attention/tma_decode_compile.py [--sass-out DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

from triton.compiler.compiler import ASTSource

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from compile_check import FLOATS, NOT_DIV16, _ptr_type, check  # noqa: E402
from sm90 import build_sm90  # noqa: E402

# (PAGES, num_warps, num_stages): the presets' tiles and their neighbours
BUILDS = [(4, 4, 3), (4, 4, 4), (4, 1, 3), (4, 1, 4), (2, 1, 4), (4, 2, 3), (2, 4, 4), (1, 1, 8)]


def tma_row(pages: int, warps: int, stages: int, pdl: bool = True, single: bool = False, sass_out=None) -> dict:
    from dayzero.kernels import triton_attention_decode_tma as T
    kern = T._decode_tma_kernel
    consts = dict(GROUP=8, G_P2=16, BS=16, HEAD_D=64, PAGES=pages, SINGLE=single, PDL=pdl)
    sig = {}
    for n in kern.arg_names:
        if n in consts:
            sig[n] = "constexpr"
        elif n in ("kc_desc", "vc_desc"):
            sig[n] = "tensordesc<bf16[16, 64]>"
        elif n.endswith("_ptr"):
            sig[n] = _ptr_type(n)
        elif n in FLOATS:
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kern.arg_names)
             if sig[n] in ("i32",) + tuple(f"*{t}" for t in ("bf16", "fp32", "i32")) and n not in NOT_DIV16}
    b = build_sm90(ASTSource(kern, sig, consts, attrs), warps, num_stages=stages)
    sass = b.sass
    if sass_out:
        pathlib.Path(sass_out, f"tma_p{pages}_w{warps}_s{stages}.sass").write_text(sass)
    return dict(kernel="_decode_tma_kernel", pages=pages, warps=warps, stages=stages, pdl=pdl, single=single,
                regs=b.regs, local_ld_st=b.spills, smem=b.smem, programs_per_sm=b.programs_per_sm,
                utmaldg=sass.count("UTMALDG"), ldgsts=sass.count("LDGSTS"), syncs_mbar=sass.count("SYNCS"),
                bar_sync=len(re.findall(r"\bBAR\.SYNC", sass)), mma=sass.count("HMMA"),
                instr=len(re.findall(r"/\*[0-9a-f]{4}\*/", sass)),
                pipelined="async_tma_copy_global_to_local" in b.ttgir and "ttng.wait_barrier" in b.ttgir)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass-out", default=None)
    a = ap.parse_args()
    for pages, warps, stages in BUILDS:
        print(tma_row(pages, warps, stages, sass_out=a.sass_out), flush=True)
    print(tma_row(4, 4, 3, single=True), flush=True)
    # the shipped split kernel (head-major default preset, PDL): its digest must stay what was measured
    from dayzero.kernels import triton_attention_splitkv as F
    base = dict(GROUP=8, G_P2=16, BS=16, HEAD_D=64, HAS_WINDOW=False, PART_BF16=False, STRIDED=True, BLOCK_N=64,
                SINGLE=False, PDL=True, HEAD_MAJOR=True, EARLY_NEW=False)
    print(check(F._decode_split2_kernel, base, 4, 3), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
