"""Compile the split-K decode MoE kernels (``triton_moe_small_split_kernels``) for sm_90 on a machine
WITHOUT a GPU and report registers per thread, spills, shared memory, the programs per SM they allow
(65536 registers, ~227 KB shared memory, 32 * warps threads per program), how many loads the
pipeliner turned into async copies, and the SASS instructions of the innermost K loop (per warp and
128-wide step). Uses Triton's bundled cuobjdump.

    PYTHONPATH=shared python bench/moe/compile_check_small.py [VARIANT ...] [--dump DIR]

Integer arguments that a real launch sees as multiples of 16 (pointers, K, N, E, most strides) get
the same divisibility hint here, so the loads vectorise and pipeline as they do on the device.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import sys

from triton.compiler.compiler import ASTSource

from dayzero.kernels import triton_moe_small_gemv as G
from dayzero.kernels import triton_moe_small_split_kernels as S
from dayzero.kernels import triton_moe_small_wg as WG
from dayzero.kernels import triton_moe_small_wgs as WGS

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from sm90 import build_sm90  # noqa: E402
NOT_DIV16 = {"T", "n_tiles", "stride_se", "stride_sn", "limit", "alpha", "offset", "P", "hs"}
TYPES = {"x_ptr": "*bf16", "h_ptr": "*bf16", "ids_ptr": "*i64", "wt_ptr": "*bf16", "w_ptr": "*fp8e4nv",
         "s_ptr": "*fp32", "b_ptr": "*bf16", "y_ptr": "*fp32", "out_ptr": "*bf16",
         "slot_e_ptr": "*i32", "slot_cnt_ptr": "*i32", "slot_pairs_ptr": "*i32", "limit": "fp32", "alpha": "fp32", "hs": "fp32",
         "ws_ptr": "*fp32", "ticket_ptr": "*i32", "trace_ptr": "*i64"}


def k_loop(sass: str) -> tuple[int, int, int]:
    """(instructions, HMMAs, plain global loads) of the innermost backward-branch loop that holds an HMMA
    (the K loop). A plain LDG there (not LDGSTS) is waited for inside the loop: the one-step-ahead block
    scale load of ``_stream`` (SK = 0) is, by the register move that carries it into the next step."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]{4})\*/", ln).group(1), 16) for ln in lines]
    best = None
    for i, ln in enumerate(lines):
        m = re.search(r"BRA (0x[0-9a-f]+)", ln)
        if m and int(m.group(1), 16) < addr[i]:
            body = [x for x, a in zip(lines, addr) if int(m.group(1), 16) <= a <= addr[i]]
            hmma = sum("HMMA" in x or "GMMA" in x for x in body)   # GMMA: the wg kernels' wgmma
            if hmma and (best is None or len(body) < best[0]):
                best = (len(body), hmma, sum(bool(re.search(r"\bLDG\.", x)) for x in body))
    return best or (0, 0, 0)


def gemv_loop(sass: str) -> int:
    """Instructions of the largest backward-branch loop that loads from global memory (the GEMV K loop)."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]{4})\*/", ln).group(1), 16) for ln in lines]
    best = 0
    for i, ln in enumerate(lines):
        m = re.search(r"BRA (0x[0-9a-f]+)", ln)
        if m and int(m.group(1), 16) < addr[i]:
            body = [x for x, a in zip(lines, addr) if int(m.group(1), 16) <= a <= addr[i]]
            if any("LDG" in x for x in body):
                best = max(best, len(body))
    return best


def check(kernel, consts: dict, warps: int = 4, stages: int = 4, maxnreg: int = 0, dump: str = "") -> dict:
    types = dict(TYPES, h_ptr="*fp16") if consts.get("H16") or "X2" in consts else TYPES
    if consts.get("HQ") or kernel in (WGS.wgs_gate_up_kernel, WGS.wgs_down_kernel):   # h handed over as e4m3 rows
        types = dict(types, h_ptr="*fp8e4nv")
    if consts.get("TMA"):  # wg tiles with wg_tma: the weights as a TMA descriptor of [E, N, K]
        types = dict(types, w_ptr=f"tensordesc<fp8e4nv[1, {consts['BN']}, 128]>")
    sig = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if n not in consts and n not in NOT_DIV16}
    b = build_sm90(ASTSource(kernel, sig, consts, attrs), warps, num_stages=stages,
                   **({"maxnreg": maxnreg} if maxnreg else {}))
    sass = b.sass
    if dump:   # --dump DIR: the PTX / SASS / TTGIR of this build
        pathlib.Path(dump).parent.mkdir(parents=True, exist_ok=True)
        for ext, text in (("ptx", b.ptx), ("sass", sass), ("ttgir", b.ttgir)):
            pathlib.Path(f"{dump}.{ext}").write_text(text)
    if "U" in consts:  # GEMV kernel: one loop trip = U steps of [BN, BK] weights
        loop, hmma, ldg = gemv_loop(sass), 0, -1
        kb_per_warp = consts["BN"] * consts["BK"] * consts["U"] / warps / 1024
    else:
        loop, hmma, ldg = k_loop(sass)
        kb_per_warp = consts["BN"] * 128 / warps / 1024   # weight KB per warp and K step
    return dict(regs=b.regs, local_ld_st=b.spills, smem=b.smem, programs_per_sm=b.programs_per_sm,
                async_copies=b.ttgir.count("async_copy_global_to_local"), loop_instr=loop, hmma=hmma, loop_ldg=ldg,
                instr_per_kb=round(loop / kb_per_warp),
                sass_sha=hashlib.sha1(re.sub(r"\.(section|file)\b.*", "", sass).encode()).hexdigest()[:12])


def split_configs(labels=None):
    """(label, kernel, consts, warps, stages, maxnreg) of the split-K candidates (``VARIANTS``): T = 1
    (fused: leader slots, the variant's split or 2) and T = 64 (plan tables, no split), 20B shapes
    (N = 5760 / 2880)."""
    from dayzero.kernels.triton_moe_small_split import VARIANTS, scale_row

    for name, kern in (("gate_up", S.gate_up_kernel), ("down", S.down_kernel)):
        for label, t in VARIANTS.items():
            if labels and label not in labels:
                continue
            if t.wg and t.wg_slots:   # T = 8 on the slot kernels (triton_moe_small_wgs), 20B: 32 pairs
                consts = dict(TOPK=4, BN=t.bn_gate_up if kern is S.gate_up_kernel else t.bn_down, BK=128, KP=4096,
                              PB=32, EVEN_K=False, DOT_F32=False, TMA=t.wg_tma, PDL=t.pdl)
                if kern is S.down_kernel:
                    consts.update(SPLIT=t.wg_split_down, TK=4)
                wk = WGS.wgs_gate_up_kernel if kern is S.gate_up_kernel else WGS.wgs_down_kernel
                yield f"{name} {label} T8 wgs", wk, consts, t.warps_down or t.warps, t.wg_stages, 0
                continue
            if t.wg:   # T = 1 on the FP8 tensor-core kernels (triton_moe_small_wg), 20B: K = 2880
                consts = dict(TOPK=4, BN=t.bn_gate_up if kern is S.gate_up_kernel else t.bn_down, BK=128, BT=16,
                              KP=4096, X2=t.wg, EVEN_K=False, DOT_F32=False, HQ=t.wg_hq, TMA=t.wg_tma, PDL=t.pdl)
                stages = t.wg_stages
                if kern is S.down_kernel:
                    consts.update(PB=16, SPLIT=t.wg_split_down)
                wk = WG.wg_gate_up_kernel if kern is S.gate_up_kernel else WG.wg_down_kernel
                consts.update(TRACE=bool(os.environ.get("WG_TRACE")))   # WG_TRACE=1: the traced build
                if not consts["TRACE"]:
                    consts["trace_ptr"] = None
                yield f"{name} {label} T1 wg", wk, consts, t.warps_down or t.warps, stages, 0
            if t.gemv and (kern is S.gate_up_kernel or t.gemv_down):  # T = 1 on the GEMV kernels (20B, K = 2880)
                bn = t.bn_gate_up if kern is S.gate_up_kernel else t.bn_down
                consts = dict(BN=bn, BK=t.gemv_bk, U=t.gemv_u, EVEN_K=2880 % (t.gemv_bk * t.gemv_u) == 0,
                              PIPE=t.gemv_pipe, G=t.gemv_group)
                if kern is S.down_kernel:
                    consts.update(TOPK=4, PB=16, DOT_F32=False, PDL=t.pdl)
                else:
                    consts.update(PDL=t.pdl)
                gk = G.gemv_gate_up_kernel if kern is S.gate_up_kernel else G.gemv_down_kernel
                warps = t.warps_down or t.warps if kern is S.down_kernel else t.warps
                yield f"{name} {label} T1 gemv", gk, consts, warps, 1, 0
            bn = t.bn_gate_up if kern is S.gate_up_kernel else t.bn_down
            fixed = t.split_gate_up if kern is S.gate_up_kernel else t.split_down
            for fused, split in ((True, fixed or 2), (False, 1)):
                consts = dict(TOPK=4, TB=64, PB=16 if fused else 32, BM=t.bm, BN=bn, BK_=128, SPLIT=split,
                              EVEN_N=(5760 if kern is S.gate_up_kernel else 2880) % bn == 0, H16=t.h16,
                              PLAN=not fused, ONE_CHUNK=fused, DOT_F32=False)
                if kern is S.down_kernel:
                    consts["FUSE"] = fused
                    consts["KP"] = 4 if t.vec_combine else 0
                consts["IDS1"] = t.ids_once and fused
                consts["PDL"] = t.pdl and fused
                consts["SK"] = scale_row(2880, split, t)
                if kern is S.gate_up_kernel:
                    consts["X16"] = t.x16
                warps = t.warps_down or t.warps if kern is S.down_kernel else t.warps
                stages = t.stages_down or t.stages if kern is S.down_kernel else t.stages
                yield f"{name} {label} {'T1' if fused else 'T64'}", kern, consts, warps, stages, 0


def main() -> int:
    args, dump = sys.argv[1:], ""
    if "--dump" in args:   # --dump DIR: write each build's PTX / SASS / TTGIR there
        i = args.index("--dump")
        dump, args = args[i + 1], args[:i] + args[i + 2:]
    for label, kern, consts, warps, stages, cap in split_configs(args or None):
        out = str(pathlib.Path(dump) / label.replace(" ", "_")) if dump else ""
        print(label, check(kern, consts, warps, stages, cap, out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
