"""sm_90 build of the small-M linear (``triton_gemv._gemv_splitk_kernel``) on a machine WITHOUT a GPU: registers,
spills, shared memory, programs per SM and the K loop's instructions (per warp and KB of FP8 weights, and the
conversions among them), for bf16 products (shipped) and ``dot16`` (fp16 products), fp8 x (q/k/v) and bf16 x (o).

    PYTHONPATH=shared python bench/linear/gemv_compile.py
"""

from __future__ import annotations

import collections
import hashlib
import pathlib
import re
import sys

from triton.compiler.compiler import ASTSource

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from sm90 import build_sm90  # noqa: E402

from dayzero.kernels import triton_gemv as G  # noqa: E402

TYPES = {"xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16",
         "ws_ptr": "*fp32", "ticket_ptr": "*i32"}
NOT_DIV16 = {"M", "stride_xsm", "stride_sn", "stride_xsk"}   # as the launches specialise them (M = 1: constant)


def k_loop(sass: str) -> list[str]:
    """The innermost backward-branch loop holding an HMMA (the K loop)."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]{4})\*/", ln).group(1), 16) for ln in lines]
    best: list[str] = []
    for i, ln in enumerate(lines):
        m = re.search(r"BRA (0x[0-9a-f]+)", ln)
        if m and int(m.group(1), 16) < addr[i]:
            body = [x for x, a in zip(lines, addr) if int(m.group(1), 16) <= a <= addr[i]]
            if any("HMMA" in x or "GMMA" in x for x in body) and (not best or len(body) < len(best)):
                best = body
    return best


def row(x_fp8: bool, dot16: bool, m1: bool, bn: int = 64, warps: int = 4, stages: int = 4, split: int = 4,
        swap: bool = False) -> dict:
    k = G._gemv_splitk_kernel
    consts = dict(BN=bn, BK=128, SPLIT=split, HAS_BIAS=True, X_SCALED=x_fp8, DOT_F32=False, DOT16=dot16, FENCE=True,
                  SWAP=swap)
    if m1:
        consts["M"] = 1
    if x_fp8:
        consts["stride_xsk"] = 1
    types = dict(TYPES, x_ptr="*fp8e4nv" if x_fp8 else "*bf16")
    sig = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in k.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names) if n not in consts and n not in NOT_DIV16}
    b = build_sm90(ASTSource(k, sig, consts, attrs), warps, num_stages=stages)
    body = k_loop(b.sass)
    ops = collections.Counter(re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", x).group(1) for x in body)
    return dict(x="fp8" if x_fp8 else "bf16", dot16=dot16, swap=swap, bn=bn, stages=stages, M="1" if m1 else "any", regs=b.regs, spills=b.spills,
                smem=b.smem, programs_per_sm=b.programs_per_sm, loop_instr=len(body),
                instr_per_warp_kb=round(len(body) / (bn * 128 / warps / 1024)),
                f2f=ops["F2F"], f2fp=ops["F2FP"], prmt=ops["PRMT"], hmma=ops["HMMA"], gmma=ops["QGMMA"] + ops["HGMMA"],
                sass_sha=hashlib.sha1(re.sub(r"\.(section|file)\b.*", "", b.sass).encode()).hexdigest()[:12])


def main() -> int:
    for x_fp8 in (True, False):
        for dot16 in (False, True):
            for m1 in (True, False):
                print(row(x_fp8, dot16, m1), flush=True)
    for bn, stages in ((64, 4), (128, 4), (64, 6)):
        for m1 in (True, False):
            print(row(True, False, m1, bn=bn, stages=stages, swap=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
