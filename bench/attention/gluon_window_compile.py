"""Build the Gluon sliding-window prefill kernel (``gluon_attention_window``) for sm_90 on a machine WITHOUT a
GPU and report, per configuration: launch registers and the partitions' setmaxnreg values (PTX), spills,
shared memory, CTAs per SM (registers x 32 x 4 (NWG + 1) threads, shared memory), wgmma / exp counts in the
SASS and, per innermost loop holding a wgmma, what ``gluon_prefill_compile._loops`` reports. ``--prefill``
also prints the prefill kernel's numbers (they must not move when shared helpers change). The ``pk*``
configurations build version 2 (``gluon_attention_window_packed``; its window is a run-time argument).

    PYTHONPATH=shared python bench/attention/gluon_window_compile.py [--configs w2,w3] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from gluon_prefill_compile import _loops  # noqa: E402
from sm90 import build_sm90  # noqa: E402


def _under_pv(sass: str) -> list[int]:
    """Per innermost wgmma loop: exps between the wait for S (two wgmma groups left) and the wait for PV."""
    out = []
    for lp in re.split(r"DEPBAR\.LE gsb0, 0x2", sass)[1:]:
        out.append(lp.split("DEPBAR.LE gsb0, 0x0")[0].count("MUFU.EX2"))
    return out


def check_packed(name: str, window: int = 128) -> dict:
    """Version 2 (``gluon_attention_window_packed``): one CTA per SM, 3 warpgroups' worth of registers."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from dayzero.kernels.gluon_attention_window import CONFIGS
    from dayzero.kernels.gluon_attention_window_packed import _diag_mode, _store_mode, window_packed_kernel as kern

    cfg = CONFIGS[name]

    def desc(rows: int) -> str:
        return f"tensordesc<bf16[{rows}, 64],{gl.NVMMASharedLayout.get_default_for([rows, 64], gl.bfloat16)!r}>"
    sig = {n: "i32" for n in kern.arg_names}
    dw = 16 * cfg.ups
    quad = f"tensordesc<bf16[16, 4, 64],{gl.NVMMASharedLayout.get_default_for([16, 4, 64], gl.bfloat16)!r}>"
    sig.update(qd=quad if cfg.q3d else desc(16), kd=desc(128), kdd=desc(dw), vd=desc(128), vdd=desc(dw), cu_ptr="*i32",
               sink_ptr="*fp32",
               o_ptr="*bf16", qk_scale="fp32", q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16")
    consts = dict(GROUP=8, S=cfg.stages, CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs,
                  num_warps=4, NC=cfg.nc, SERIAL=cfg.serial, UPS=cfg.ups,
                  DIRECT=_store_mode(cfg), PF=cfg.prefetch, DIAG=_diag_mode(cfg), Q3=cfg.q3d,
                  KVR=cfg.kv_ring)
    if _store_mode(cfg) >= 2:
        sig.update(od=quad if cfg.q3d else desc(16))
    else:
        consts.update(od=None)   # what the JIT does with a None argument
    sig.update({k: "constexpr" for k in consts})
    attrs = {(i, ): [["tt.divisibility", 16]] for i, n in enumerate(kern.arg_names)
             if n in ("cu_ptr", "sink_ptr", "o_ptr", "stride_ot", "stride_oh", "q_ptr", "k_ptr", "v_ptr", "stride_qt",
                      "stride_kt", "stride_vt")}
    b = build_sm90(GluonASTSource(kern, sig, consts, attrs), 4, maxnreg=cfg.maxnreg)
    setmax = sorted(set(int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", b.ptx)))
    threads = 128 * (cfg.nc + 1)
    by_regs = 65536 // (threads * -(-b.regs // 8) * 8)
    return dict(config=name, window=window, stages=cfg.stages, nc=cfg.nc, serial=cfg.serial, ups=cfg.ups,
                prefetch=cfg.prefetch, bulk_prefetch=b.sass.count("UBLKPF"),
                regs_launch=b.regs, setmaxnreg=setmax, consumer_regs=cfg.consumer_regs,
                smem_kb=round((b.smem - 1024) / 1024, 1), ctas_per_sm=min(by_regs, 227 * 1024 // b.smem),
                spill_ldl_stl=b.spills, hgmma=b.sass.count("HGMMA"),
                mufu_ex2=b.sass.count("MUFU.EX2"), sass_total=len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+[A-Z@]", b.sass)),
                loops=_loops(b.sass), ex2_under_pv=_under_pv(b.sass),
                sass_sha=hashlib.sha256(b.sass.encode()).hexdigest()[:12])


def check(name: str, window: int = 128) -> dict:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from dayzero.kernels.gluon_attention_window import CONFIGS, window_kernel as kern

    cfg = CONFIGS[name]
    if name.startswith("pk"):
        return check_packed(name, window)
    lay = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    desc = f"tensordesc<bf16[64, 64],{lay!r}>"
    sig = {n: "i32" for n in kern.arg_names}
    sig.update(q_desc=desc, k_desc=desc, v_desc=desc, cu_ptr="*i32", sink_ptr="*fp32", o_ptr="*bf16",
               qk_scale="fp32")
    consts = dict(GROUP=8, TB=cfg.tb, HW=cfg.hw, HPC=cfg.hpc, MID_MASK=int(window < 128),
                  DIAG_MASK=2 if cfg.causal_diag and window >= 64 else 1, CONSUMER_REGS=cfg.consumer_regs,
                  PRODUCER_REGS=cfg.producer_regs, num_warps=4, PRODUCER=cfg.producer)
    sig.update({k: "constexpr" for k in consts})
    # what the JIT specializes at a real launch: 16-byte aligned pointers, strides divisible by 16
    attrs = {(i, ): [["tt.divisibility", 16]] for i, n in enumerate(kern.arg_names)
             if n in ("cu_ptr", "sink_ptr", "o_ptr", "stride_ot", "stride_oh")}
    b = build_sm90(GluonASTSource(kern, sig, consts, attrs), 4, maxnreg=cfg.maxnreg)
    setmax = sorted(set(int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", b.ptx)))
    threads = 128 * (cfg.nwg + cfg.producer)           # the producer warp's warpgroup counts whole
    by_regs = 65536 // (threads * -(-b.regs // 8) * 8)  # allocated in steps of 8 per thread
    by_smem = 227 * 1024 // b.smem
    return dict(config=name, window=window, tb=cfg.tb, hw=cfg.hw, hpc=cfg.hpc, regs_launch=b.regs, setmaxnreg=setmax,
                consumer_regs=cfg.consumer_regs, smem_kb=round((b.smem - 1024) / 1024, 1),
                ctas_per_sm=min(by_regs, by_smem), spill_ldl_stl=b.spills, hgmma=b.sass.count("HGMMA"),
                mufu_ex2=b.sass.count("MUFU.EX2"),
                sass_total=len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+[A-Z@]", b.sass)), loops=_loops(b.sass))


def main() -> int:
    from dayzero.kernels.gluon_attention_window import CONFIGS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--windows", default="128")
    ap.add_argument("--prefill", action="store_true", help="also the prefill kernel's pp3_nopin build")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rows = []
    for name in a.configs.split(","):
        for w in (int(x) for x in a.windows.split(",")):
            try:
                r = check(name, w)
            except Exception as e:  # noqa: BLE001 - one configuration's failure keeps the others
                r = dict(config=name, window=w, error=f"{type(e).__name__}: {str(e)[:3000]}")
            rows.append(r)
            print(json.dumps(r), flush=True)
    if a.prefill:
        from gluon_prefill_compile import check as prefill_check
        r = prefill_check("pp3_nopin")
        r.pop("loops")
        rows.append(dict(prefill=r))
        print(json.dumps(rows[-1]), flush=True)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
