"""sm_90 build of the one-launch T = 1 decode MoE (``gluon_moe_stream``) on a machine without a GPU: registers,
shared memory, spills, QGMMA count, SASS digest, per configuration (20B / 120B call shapes on an H200's 132 SMs).
Usage: PYTHONPATH=shared python bench/moe/compile_check_stream.py [VARIANT ...] [--dump DIR]"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", default=["gx1_s20", "gx2_s8", "gx3_s4"])
    ap.add_argument("--dump", default=None)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--trace", action="store_true", help="the TRACE build (bench/moe/stream_trace.py)")
    args = ap.parse_args()
    import torch
    from sm90 import build_sm90
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from dayzero.kernels.gluon_moe_stream import moe_stream_kernel, stream_shape
    from dayzero.kernels.triton_moe_small_split import VARIANTS

    wl = gl.NVMMASharedLayout.get_default_for([64, 128], gl.float8e4nv)
    for name in args.variants:
        t = VARIANTS[name]
        ex = SimpleNamespace(gate_up=torch.empty(0), down=torch.empty(0))
        run = SimpleNamespace(ex=ex, tiles=t, H=2880, I=2880, T=1, P=4, limit=7.0)
        shape = stream_shape(run, args.sms * t.stream_ctas)
        consts = {k: v for k, v in shape.items() if k not in ("NT1", "NT2")}
        kern = moe_stream_kernel
        sig = {n: "i32" for n in kern.arg_names}
        sig.update(x_ptr="*bf16", ids_ptr="*i32", wt_ptr="*bf16", s1_ptr="*fp32", s2_ptr="*fp32", b1_ptr="*bf16",
                   b2_ptr="*bf16", part_ptr="*i64", ctrl_ptr="*i32", out_ptr="*bf16",
                   limit="fp32", alpha="fp32", hs="fp32", w1_desc=f"tensordesc<fp8e4nv[64, 128],{wl!r}>",
                   w2_desc=f"tensordesc<fp8e4nv[64, 128],{wl!r}>")
        consts["num_warps"] = 4
        consts["TRACE"] = args.trace
        sig["trace_ptr"] = "*i64"
        sig.update({k: "constexpr" for k in consts})
        attrs = {(kern.arg_names.index(n), ): [["tt.divisibility", 16]]
                 for n in ("x_ptr", "part_ptr", "out_ptr", "b1_ptr", "b2_ptr", "H", "I")}
        opts = dict(maxnreg=65536 // (128 * t.stream_ctas) // 8 * 8) if t.stream_ctas > 2 else {}
        b = build_sm90(GluonASTSource(kern, sig, consts, attrs), 4, **opts)
        row = dict(variant=name, regs=b.regs, per_sm=b.programs_per_sm, smem_kb=round((b.smem - 1024) / 1024, 1), spills=b.spills,
                   qgmma=b.sass.count("QGMMA"), atom=b.sass.count("ATOM") + b.sass.count("RED."),
                   sass=hashlib.sha256(b.sass.encode()).hexdigest()[:12], **shape)
        print(json.dumps(row), flush=True)
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            for ext, text in (("sass", b.sass), ("ptx", b.ptx), ("ttgir", b.ttgir)):
                with open(os.path.join(args.dump, f"{name}.{ext}"), "w", encoding="utf-8") as f:
                    f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
