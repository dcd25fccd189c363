"""Build the causal prefill kernel's variants (prefill_variants.py) for sm_90 on a machine WITHOUT a GPU
and report what the GPU would run: registers, spills, shared memory, programs per SM, per-kernel
instruction counts (MUFU.EX2, FFMA, FADD, FMUL, ...), and per loop (every backward branch whose body
holds a wgmma) its length, exp2s, FMULs and local loads / stores: the TMA full-tile loop is the hot one.

    PYTHONPATH=shared python bench/attention/prefill_compile.py [--variants a,b] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

from triton.compiler.compiler import ASTSource

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from sm90 import build_sm90  # noqa: E402
from prefill_variants import VARIANTS  # noqa: E402

NOT_DIV16 = {"window", "stride_ot", "qk_scale"}


def check(cfg: dict) -> dict:
    from dayzero.kernels import triton_attention_prefill as P
    base = P.default_prefill_config(64, 0)
    if ("BLOCK_M" in cfg or "BLOCK_N" in cfg) and "maxnreg" not in cfg:
        base.pop("maxnreg", None)  # as the launcher: the default's cap belongs to its tile shape
    cfg = dict(base, **cfg)
    bm, bn = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
    cfg.pop("PACK"), cfg.pop("TMA")
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    opts = {"maxnreg": cfg.pop("maxnreg")} if cfg.get("maxnreg") else {}
    cfg.pop("maxnreg", None)
    consts = dict(GROUP=8, P=1, BS=16, HEAD_D=64, BLOCK_M=bm, BLOCK_N=bn, HAS_WINDOW=False, TMA=True, **cfg)
    kern = P._prefill_kernel
    sig = {}
    for n in kern.arg_names:
        if n in consts:
            sig[n] = "constexpr"
        elif n in ("k_desc", "v_desc"):
            sig[n] = f"tensordesc<bf16[{bn}, 64]>"
        elif n in ("bt_ptr", "cu_ptr", "cl_ptr"):
            sig[n] = "*i32"
        elif n == "sink_ptr":
            sig[n] = "*fp32"
        elif n.endswith("_ptr"):
            sig[n] = "*bf16"
        elif n == "qk_scale":
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kern.arg_names)
             if sig[n] not in ("constexpr", "fp32") and not sig[n].startswith("tensordesc") and n not in NOT_DIV16}
    b = build_sm90(ASTSource(kern, sig, consts, attrs), warps, num_stages=stages, **opts)
    ops = {}
    for line in b.sass.splitlines():
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m:
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    loops = []
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", b.sass)]
    for addr, text in ins:  # a backward branch closes a loop: count what its body holds
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        if m and m.group(1) and int(m.group(1), 16) < addr:
            body = [t for a_, t in ins if int(m.group(1), 16) <= a_ <= addr]
            cnt = lambda p: sum(t.split()[0 if not t.startswith("@") else 1].startswith(p) for t in body)  # noqa: E731
            if cnt("HGMMA"):
                loops.append(dict(n=len(body), hgmma=cnt("HGMMA"), ex2=cnt("MUFU.EX2"), ldl=cnt("LDL"), stl=cnt("STL"),
                                  ffma=cnt("FFMA"), fadd=cnt("FADD"), fmul=cnt("FMUL")))
    pick = lambda *pre: sum(c for o, c in ops.items() if any(o.startswith(p) for p in pre))  # noqa: E731
    return dict(regs=b.regs, spills=b.spills, smem=b.smem, programs_per_sm=b.programs_per_sm,
                mufu_ex2=pick("MUFU.EX2"), ffma=pick("FFMA"), fadd=pick("FADD"), fmul=pick("FMUL"),
                fmnmx=pick("FMNMX"), int_ops=pick("IADD", "LEA", "SHF", "SHL", "IMAD"), f2fp=pick("F2FP"),
                sts=pick("STS"), lds=pick("LDS"), stsm=pick("STSM"), hgmma=pick("HGMMA"), bar=pick("BAR"),
                total=sum(ops.values()), loops=loops)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rows = []
    for name in a.variants.split(","):
        try:
            r = dict(variant=name, **check(VARIANTS[name]))
        except Exception as e:  # noqa: BLE001 - one variant's failure keeps the others
            r = dict(variant=name, error=f"{type(e).__name__}: {str(e)[:300]}")
        rows.append(r)
        print(json.dumps(r), flush=True)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
