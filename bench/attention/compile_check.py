"""Compile the attention kernels for sm_90 on a machine WITHOUT a GPU and report registers per
thread, local-memory (spill) instructions, shared memory and the programs per SM they allow
(65536 registers, ~227 KB shared memory). Uses Triton's bundled cuobjdump.

    PYTHONPATH=shared python bench/attention/compile_check.py [decode|splitkv|window ...]

Integer arguments a real launch sees as multiples of 16 (pointers, most strides) get the same
divisibility hint here, so loads vectorise and pipeline as on the device.
"""

from __future__ import annotations

import hashlib
import pathlib
import re
import sys

from triton.compiler.compiler import ASTSource

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from sm90 import build_sm90  # noqa: E402
FLOATS = {"qk_scale", "scale"}
NOT_DIV16 = {"window", "num_splits", "bt_cols", "stride_ot", "total_tiles", "n_tiles", "cached_max"}


def _ptr_type(name: str) -> str:
    if name in ("bt_ptr", "cu_ptr", "cl_ptr", "cnt_ptr", "tile_ptr"):
        return "*i32"
    if name in ("sink_ptr", "mp_ptr", "lp_ptr", "op_ptr"):
        return "*fp32"
    return "*bf16"


def check(kernel, consts: dict, num_warps: int, num_stages: int, maxnreg: int = 0, i32_ptrs=()) -> dict:
    sig = {}
    for n in kernel.arg_names:
        if n in consts:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = "*i32" if n in i32_ptrs else _ptr_type(n)
        elif n in FLOATS:
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if n not in consts and n not in NOT_DIV16 and n not in FLOATS}
    b = build_sm90(ASTSource(kernel, sig, consts, attrs), num_warps, num_stages=num_stages,
                   **({"maxnreg": maxnreg} if maxnreg else {}))
    sass = b.sass
    return dict(kernel=kernel.fn.__name__, consts={k_: v for k_, v in consts.items() if k_.isupper()},
                warps=num_warps, stages=num_stages, maxnreg=maxnreg, regs=b.regs,
                local_ld_st=b.spills, smem=b.smem, programs_per_sm=b.programs_per_sm,
                ldgsts="LDGSTS" in sass, tma="UTMALDG" in sass, ldg128=sass.count("LDG.E.128"),
                mma=sass.count("HMMA"), gmma=sass.count("HGMMA"),
                instr=len(re.findall(r"/\*[0-9a-f]{4}\*/", sass)),
                # the instructions alone (no addresses or encodings): equal digests = the same code
                digest=hashlib.sha1("\n".join(re.findall(r"/\*[0-9a-f]{4}\*/\s*([^;]*;)", sass)).encode()).hexdigest()[:12])


def decode_rows():
    from dayzero.kernels import triton_attention_decode as K
    base = dict(GROUP=8, G_P2=16, BS=16, HEAD_D=64, HAS_WINDOW=False, SINGLE=False)
    for bn, w, s, pdl in ((128, 4, 3, False), (128, 4, 3, True), (64, 4, 3, False), (64, 4, 3, True),
                          (128, 8, 3, False), (256, 8, 3, False)):
        yield check(K._decode_split_kernel, dict(base, BLOCK_N=bn, PDL=pdl), w, s)
    for pdl in (False, True):
        yield check(K._combine_kernel, dict(GROUP=8, HEAD_D=64, S_P2=64, PDL=pdl), 1, 3)


def splitkv_rows():
    from dayzero.kernels import triton_attention_splitkv as F
    base = dict(GROUP=8, G_P2=16, BS=16, HEAD_D=64, HAS_WINDOW=False, PART_BF16=False, STRIDED=True, BLOCK_N=64,
                SINGLE=False, PDL=False, HEAD_MAJOR=False, EARLY_NEW=False, EARLY_KV=0)
    for bn, st, strided, mx in ((64, 3, True, 0), (64, 4, True, 0), (128, 3, False, 128), (128, 3, False, 0)):
        yield check(F._decode_split2_kernel, dict(base, BLOCK_N=bn, STRIDED=strided), 4, st, maxnreg=mx)
    yield check(F._decode_split2_kernel, dict(base, PDL=True), 4, 3)
    yield check(F._decode_split2_kernel, dict(base, PDL=True, HEAD_MAJOR=True), 4, 3)   # the shipped preset
    for ekv in (1, 2):   # session 9 candidates: tiles loaded before the PDL wait
        yield check(F._decode_split2_kernel, dict(base, PDL=True, HEAD_MAJOR=True, EARLY_KV=ekv), 4, 3)
    for bn, st in ((64, 3), (128, 2)):   # one split (SINGLE: writes the output itself)
        yield check(F._decode_split2_kernel, dict(base, BLOCK_N=bn, SINGLE=True), 4, st)
    for pdl in (False, True):
        yield check(F._merge_kernel, dict(GROUP=8, HEAD_D=64, S_P2=64, PART_BF16=False, PDL=pdl, EARLY_TRIGGER=False),
                    1, 3)
    yield check(F._merge_kernel, dict(GROUP=8, HEAD_D=64, S_P2=64, PART_BF16=False, PDL=True, EARLY_TRIGGER=True), 1, 3)


def window_rows():
    from dayzero.kernels import triton_attention_window as W
    base = dict(GROUP=8, TOK_N=16, WIN_N=128, BS=16, HEAD_D=64)
    yield check(W._window_kernel, dict(base, TOK=8, TMA=False, BRANCH=False), 4, 1)


def main() -> int:
    which = set(sys.argv[1:]) or {"decode", "splitkv", "window"}
    rows = {"decode": decode_rows, "splitkv": splitkv_rows, "window": window_rows}
    for name, fn in rows.items():
        if name in which:
            for r in fn():
                print(r, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
