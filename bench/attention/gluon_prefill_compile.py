"""Build the Gluon ping-pong prefill kernel (``gluon_attention_prefill``) for sm_90 on a machine WITHOUT a
GPU and report what the GPU would run, per configuration: launch registers and the setmaxnreg values of
the partitions (PTX), spills, shared memory, wgmma count in the SASS (HGMMA) and per key loop (the
innermost loops holding a wgmma: unmasked and masked loop of each consumer warpgroup) its length, HGMMA,
MUFU.EX2, float ops, shared-memory and local (spill) accesses, barriers, and ``ex2_under_pv``: the exps
that sit between the wait for S (``DEPBAR.LE gsb0, 0x1``) and the wait for the PV product (``0x0``), i.e.
the softmax that overlaps the warpgroup's own PV wgmma (0 when ptxas hoists the PV wait above it).

    PYTHONPATH=shared python bench/attention/gluon_prefill_compile.py [--configs pp2,pp3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from sm90 import build_sm90  # noqa: E402


def _loops(sass: str) -> list[dict]:
    """Innermost loops holding a wgmma (backward branches whose body holds no other such loop): the key
    loops of each consumer, with their length and what they hold."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    spans = []
    for addr, text in ins:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        if m and m.group(1) and int(m.group(1), 16) < addr:
            spans.append((int(m.group(1), 16), addr))
    out = []
    for lo, hi in spans:
        body = [t for a, t in ins if lo <= a <= hi]
        if not any("HGMMA" in t for t in body):
            continue
        inner = [(a, b) for a, b in spans if (a, b) != (lo, hi) and lo <= a and b <= hi
                 and any("HGMMA" in t for x, t in ins if a <= x <= b)]
        if inner:
            continue

        def cnt(prefix: str, body=body) -> int:
            return sum(t.split()[1 if t.startswith("@") else 0].startswith(prefix) for t in body)
        w1 = [i for i, t in enumerate(body) if "DEPBAR.LE gsb0, 0x1" in t]
        w0 = [i for i, t in enumerate(body) if "DEPBAR.LE gsb0, 0x0" in t]
        # exps between "S done" and "PV done": the softmax overlaps this warpgroup's own PV wgmma
        overlap = cnt("MUFU.EX2", body[w1[0]:w0[-1]]) if w1 and w0 and w1[0] < w0[-1] else 0
        out.append(dict(n=len(body), hgmma=cnt("HGMMA"), ex2=cnt("MUFU.EX2"), ex2_under_pv=overlap, ffma=cnt("FFMA"),
                        fadd=cnt("FADD"), fmul=cnt("FMUL"), fmnmx=cnt("FMNMX"), f2fp=cnt("F2FP"), sts=cnt("STS"),
                        lds=cnt("LDS"), ldl=cnt("LDL"), stl=cnt("STL"), syncs=cnt("SYNCS"), bar=cnt("BAR")))
    return out


def check(name: str) -> dict:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from dayzero.kernels.gluon_attention_prefill import CONFIGS, prefill_pingpong_kernel as kern

    cfg = CONFIGS[name]
    if cfg.persistent:
        from dayzero.kernels.gluon_attention_prefill_persistent import prefill_pingpong_persistent_kernel as kern
    ql = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    kl = gl.NVMMASharedLayout.get_default_for([cfg.block_n, 64], gl.bfloat16)
    sig = {n: "i32" for n in kern.arg_names}
    sig.update(q_desc=f"tensordesc<bf16[64, 64],{ql!r}>", k_desc=f"tensordesc<bf16[{cfg.block_n}, 64],{kl!r}>",
               v_desc=f"tensordesc<bf16[{cfg.block_n}, 64],{kl!r}>", cu_ptr="*i32", sink_ptr="*fp32",
               o_ptr="*bf16", qk_scale="fp32")
    consts = dict(GROUP=8, NWG=cfg.nwg, BN=cfg.block_n, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
                  PRODUCER_REGS=cfg.producer_regs, num_warps=4, PP=cfg.pingpong,
                  PIN=cfg.pin, CARRY=cfg.carry_a)
    sig.update({k: "constexpr" for k in consts})
    # what the JIT specializes at a real launch: 16-byte aligned pointers, strides divisible by 16
    attrs = {(i, ): [["tt.divisibility", 16]] for i, n in enumerate(kern.arg_names)
             if n in ("cu_ptr", "sink_ptr", "o_ptr", "stride_ot", "stride_oh")}
    b = build_sm90(GluonASTSource(kern, sig, consts, attrs), 4, maxnreg=cfg.maxnreg)
    setmax = sorted(set(int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", b.ptx)))
    return dict(config=name, nwg=cfg.nwg, block_n=cfg.block_n, stages=cfg.stages, regs_launch=b.regs,
                setmaxnreg=setmax, smem_kb=round((b.smem - 1024) / 1024, 1), spill_ldl_stl=b.spills,
                hgmma=b.sass.count("HGMMA"), mufu_ex2=b.sass.count("MUFU.EX2"),
                sass_total=len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+[A-Z@]", b.sass)),
                loops=_loops(b.sass))


def main() -> int:
    from dayzero.kernels.gluon_attention_prefill import CONFIGS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rows = []
    for name in a.configs.split(","):
        try:
            r = check(name)
        except Exception as e:  # noqa: BLE001 - one configuration's failure keeps the others
            r = dict(config=name, error=f"{type(e).__name__}: {str(e)[:2000]}")
        rows.append(r)
        print(json.dumps(r), flush=True)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
