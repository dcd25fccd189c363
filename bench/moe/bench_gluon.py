"""Gluon warp-specialised MoE GEMMs (``gluon_moe_gemm``) beside the Triton large-M kernel, one GPU.

    PYTHONPATH=shared python bench/moe/bench_gluon.py --out DIR [--variants op,gluon64,...]
        [--balanced-variants ...] [--experts 32,128] [--tokens 8192]       # MOE_GLUON_NAME: file name
        [--interleave op,gluon128_fws,...] [--interleave-reps 40]         # layer graphs timed in turns
    PYTHONPATH=shared python bench/moe/bench_gluon.py --compile [--out DIR]     # no GPU needed

GPU mode writes DIR/moe-gluon.json: per E (default 32 and 128), 8192 tokens, top-4, random and
balanced routing: the whole MoE layer, each GEMM (ms, TFLOP/s useful) and the glue stages for each
variant, timed with triton's do_bench (``ms``, ``*_ms``: each call launched from Python after an L2
flush; in Gluon run 6 a GEMM's do_bench time exceeded the traced span of its tiles by 0.08-0.22 ms) and
as CUDA-graph replays (``*_ms_graph``, ``tflops_useful_graph``: no host launch gaps) for each
variant (``triton_large``: the Triton large-M kernels; ``op``: the Gluon configuration the registered
op picks for the call, ``config_for``; ``gluon`` = ``gluon64``, ``gluon128*``: 64- / 128-row tiles)
on the same weights and routing, with the full / half tile counts of 128-row alignments (and, for
``--trace-variants``, per-tile times from the kernel's trace: ``gluon_trace``); every output
is checked against the torch FP8 reference (rel) and for unwritten / non-finite elements (out and y
NaN-filled first).
Compile mode compiles both GEMMs for sm_90 with Triton's bundled ptxas (registers, shared memory,
spills, QGMMA count, setmaxnreg values) and writes DIR/moe-gluon-compile.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import sys

H = I = 2880
K_TOP = 4
LIMIT = 7.0
DEFAULT_VARIANTS = "op,gluon64,gluon128,gluon128_h1"


def _configs() -> dict:
    from dayzero.kernels.gluon_moe_gemm_run import BM64, BM128, BM128_RUN8 as R8, DEFAULT

    r = dataclasses.replace
    return {"gluon": DEFAULT, "gluon64": BM64, "gluon_s3": r(BM64, stages=3), "gluon_s5": r(BM64, stages=5),
            "gluon_g8": r(BM64, group_m=8), "gluon_g32": r(BM64, group_m=32),
            "gluon_gate_up_only": r(BM64, down=False),
            # 128-row tiles (gluon_moe_gemm128): the consumers split M and share the W tile
            "gluon128": BM128, "gluon128_s3": r(BM128, stages=3),
            "gluon128_g4": r(BM128, group_m=4), "gluon128_g16": r(BM128, group_m=16),
            "gluon128_h1": r(BM128, half=1), "gluon128_h2": r(BM128, half=2),
            # align + x quantization in three launches (align_quant_pairs) instead of the Triton path's four
            "gluon64_glue": r(BM64, glue=True), "gluon128_glue": r(BM128, glue=True),
            # the walk by expert (groups inside an expert's run of blocks: no group straddles two experts)
            "gluon64_w": r(BM64, walk=1), "gluon128_w": r(BM128, walk=1), "gluon128_h2_w": r(BM128, half=2, walk=1),
            "gluon128_w_glue": r(BM128, walk=1, glue=True), "gluon128_w_g16": r(BM128, walk=1, group_m=16),
            # dynamic tile scheduling (a global counter hands out the walk positions; gluon_moe_sched)
            "gluon128_d": r(BM128, sched=1), "gluon128_h2_d": r(BM128, half=2, sched=1),
            "gluon128_d_glue": r(BM128, sched=1, glue=True), "gluon128_h2_d_glue": r(BM128, half=2, sched=1, glue=True),
            "gluon128_h2_glue": r(BM128, half=2, glue=True),
            # session 6 (run 9): fast gate_up epilogue, W boxes per weight block, 4 pairs per glue program
            # (run 9 made fast_epi + wsplit + glue at 4 pairs the shipped BM128; run8 = BM128_RUN8, the one before)
            "run8": R8, "gluon128_f": r(R8, fast_epi=True), "gluon128_ws": r(R8, wsplit=True),
            "gluon128_glue4": r(R8, glue=True, glue_rows=4),
            "gluon128_fws": r(R8, fast_epi=True, wsplit=True),
            "gluon128_fws_glue4": r(R8, fast_epi=True, wsplit=True, glue=True, glue_rows=4),
            "gluon128_h2_fws_glue4": r(R8, half=2, fast_epi=True, wsplit=True, glue=True, glue_rows=4),
            "gluon128_zpad": r(BM128, zpad=True),                  # the shipped BM128 + zero padding rows
            # BM128 at a 240 / 24 register split (session 8: a tie with BM128 in the interleaved layer times; the
            # folded-tail kernels it was built for lost there and were removed, bench/NOTES.md "Session 8, lead")
            "gluon128_r240": r(BM128, consumer_regs=240, producer_regs=24),
            # timing diagnostics (wrong results): where the time goes
            "diag_w_once_per_tile": r(BM64, diag=1), "diag_a_once_per_tile": r(BM64, diag=2),
            "diag128_half_w_once": r(BM128, half=3)}


SPECIALISED = ("bias_ptr", "c_ptr", "cs_ptr", "sorted_ids_ptr", "block_expert_ptr", "weights_ptr", "trace_ptr", "span_ptr",
               "counter_ptr", "N", "K", "num_pairs", "stride_biase", "stride_cm", "stride_cs")


def compile_check(out: str | None, names: list[str] | None = None) -> int:
    """sm_90 compile of both GEMMs per configuration (``names``: these only), no GPU."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from sm90 import build_sm90
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from dayzero.kernels.gluon_moe_gemm import moe_gemm_ws_kernel
    from dayzero.kernels.gluon_moe_gemm128 import moe_gemm_ws128_kernel

    bl = gl.NVMMASharedLayout.get_default_for([256, 128], gl.float8e4nv)
    sbl = gl.NVMMASharedLayout.get_default_for([8, 4], gl.float32)
    rows = []
    for name, cfg in _configs().items():
        if not cfg.down or cfg.diag or (names and name not in names):
            continue
        bm = cfg.bm
        kern = moe_gemm_ws128_kernel if bm == 128 else moe_gemm_ws_kernel
        a_rows = 64 if bm == 128 and cfg.half >= 2 else bm
        al = gl.NVMMASharedLayout.get_default_for([a_rows, 128], gl.float8e4nv)
        sal = gl.NVMMASharedLayout.get_default_for([1, bm], gl.float32)
        for epi in (1, 2):
            sig = {n: "i32" for n in kern.arg_names}
            sig.update(sa_desc=f"tensordesc<fp32[1, {bm}],{sal!r}>", sb_desc=f"tensordesc<fp32[8, 4],{sbl!r}>")
            w_rows = 128 if cfg.wsplit else 256
            sig.update(a_desc=f"tensordesc<fp8e4nv[{a_rows}, 128],{al!r}>",
                       b_desc=f"tensordesc<fp8e4nv[{w_rows}, 128],{bl!r}>",
                       bias_ptr="*bf16", c_ptr="*fp8e4nv" if epi == 1 else "*bf16",
                       cs_ptr="*fp32", sorted_ids_ptr="*i32", block_expert_ptr="*i32", weights_ptr="*bf16",
                       limit="fp32", alpha="fp32", span_ptr="*i32")
            consts = dict(EPI=epi, STAGES=cfg.stages, GROUP_M=cfg.group_m, CONSUMER_REGS=cfg.consumer_regs,
                          PRODUCER_REGS=cfg.producer_regs, num_warps=4, WALK=cfg.walk)
            if bm == 64:
                consts["DIAG"] = cfg.diag
            else:
                consts.update(HALF=cfg.half, TRACE=False, SCHED=cfg.sched,
                              OPT=int(cfg.fast_epi) | 2 * int(cfg.wsplit) | 4 * int(cfg.zpad))
                sig.update(trace_ptr="*i64", counter_ptr="*i32")
            sig.update({k: "constexpr" for k in consts})
            # as the JIT specialises them at the 2880-wide shapes (16-divisible pointers and sizes): without this
            # the build shows byte-wide epilogue stores that the GPU's build does not have (Gluon run 9)
            attrs = {(kern.arg_names.index(n), ): [["tt.divisibility", 16]] for n in SPECIALISED if n in kern.arg_names}
            b = build_sm90(GluonASTSource(kern, sig, consts, attrs), 4, maxnreg=cfg.maxnreg)
            if names and len(names) == 1:
                print(f"sass sha256 {name} epi {epi}: {hashlib.sha256(b.sass.encode()).hexdigest()}", flush=True)
            rows.append(dict(config=name, bm=bm, gemm="gate_up" if epi == 1 else "down", stages=cfg.stages,
                             regs_kernel=b.regs,
                             setmaxnreg=sorted(set(int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)",
                                                                             b.ptx))),
                             smem_kb=round((b.smem - 1024) / 1024, 1), spill_ldl_stl=b.spills,
                             qgmma=b.sass.count("QGMMA")))
            print(json.dumps(rows[-1]), flush=True)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "moe-gluon-compile.json"), "w", encoding="utf-8") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


def _flop(T: int) -> float:
    return 6.0 * T * K_TOP * H * I


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _tile_stats(run) -> dict:
    """Used M blocks and padding of the run's alignment; for 128-row blocks, how many are full tiles
    (rows 64-127 hold a routed pair) and how many half tiles (read on the host after the run)."""
    al = run.al
    used = int((al.block_expert >= 0).sum())
    row = dict(block_m=al.block_m, used_blocks=used, padded_rows_used=used * al.block_m)
    if al.block_m == 128:
        full = int((al.sorted_ids.view(-1, 128)[:used, 64] < al.num_pairs).sum())
        row.update(full_tiles=full, half_tiles=used - full)
    return row


def moe_layer(res, E: int, T: int, variants: list[str], balanced_variants: list[str],
              trace_variants: tuple[str, ...] = (), graph: bool = True) -> None:
    import torch
    from common import graph_us, median_ms, random_experts, routing

    from dayzero.kernels import torch_ops
    from dayzero.kernels.gluon_moe_gemm_run import GluonMoeRun, config_for
    from dayzero.kernels.triton_moe import LARGE, MoeRun

    cfgs = _configs()
    ex = random_experts(E, H, I, seed=E)
    x = torch.randn(T, H, device="cuda").bfloat16()
    for balanced in (False, True):
        if not (balanced_variants if balanced else variants):
            continue
        w, ids = routing(T, E, K_TOP, balanced, seed=T)
        ref = torch_ops.moe_experts(x, w, ids, ex, LIMIT)
        for var in (variants if not balanced else balanced_variants):
            if var == "triton_large":
                run = MoeRun(x, w, ids, ex, LIMIT, tiles=LARGE, small=False)
            elif var == "op":                      # what the registered op runs for this call
                run = GluonMoeRun(x, w, ids, ex, LIMIT, config_for(ids.numel(), E))
            else:
                run = GluonMoeRun(x, w, ids, ex, LIMIT, cfgs[var])
            run.out.fill_(float("nan"))
            run.y.fill_(float("nan"))
            out = run().clone()
            ms = median_ms(run)
            row = dict(section="moe_gluon", E=E, T=T, balanced=balanced, variant=var, ms=ms,
                       tflops_useful=_flop(T) / ms / 1e9, finite=bool(torch.isfinite(out).all()),
                       rel_vs_torch_ref=_rel(out, ref),
                       gluon=bool(getattr(run, "gluon_ok", lambda: False)()))
            for stage, frac in (("gate_up", 2 / 3), ("down", 1 / 3)):
                sms = median_ms(getattr(run, stage))
                row[f"{stage}_ms"], row[f"{stage}_tflops"] = sms, _flop(T) * frac / sms / 1e9
            for stage in ("align", "quant", "combine"):                 # the glue (align last: same blocks)
                row[f"{stage}_ms"] = median_ms(getattr(run, stage))
            if graph:                                                   # GPU time without host launch gaps
                try:
                    for stage in ("layer", "align", "quant", "gate_up", "down", "combine"):
                        fn = run if stage == "layer" else getattr(run, stage)
                        row[f"{stage}_ms_graph"] = graph_us([fn] * 4) / 1e3
                    row["tflops_useful_graph"] = _flop(T) / row["layer_ms_graph"] / 1e9
                except Exception as exc:                                # keep the row
                    row["graph_error"] = repr(exc)
            row.update(_tile_stats(run))
            if var in trace_variants and run.cfg.bm == 128 and run.gluon_ok():    # per-tile times (gluon_trace)
                from gluon_trace import tile_times

                try:
                    row.update(tile_times(run, "gate_up"))
                    row.update(tile_times(run, "down"))
                except Exception as exc:                                    # a diagnostic: keep the row
                    row["trace_error"] = repr(exc)
            res.add(**row)
            del run, out


def interleaved(res, E: int, T: int, variants: list[str], reps: int) -> None:
    """Layer time of each variant as CUDA-graph replays taken in turns (variant 1, 2, ..., 1, 2, ...;
    ``reps`` rounds, one replay of a 4-call graph each), so clock and power drift hits every variant
    alike (separate timings of one configuration moved by up to 10 % within a call in runs 6-8); both
    routings. Rows: median / min / max ms per call and TFLOP/s useful from the median."""
    import statistics

    import torch
    from common import random_experts, routing

    from dayzero.kernels.gluon_moe_gemm_run import GluonMoeRun, config_for

    cfgs = _configs()
    ex = random_experts(E, H, I, seed=E)
    x = torch.randn(T, H, device="cuda").bfloat16()
    for balanced in (False, True):
        w, ids = routing(T, E, K_TOP, balanced, seed=T)
        graphs = {}
        for var in variants:
            run = GluonMoeRun(x, w, ids, ex, LIMIT, config_for(ids.numel(), E) if var == "op" else cfgs[var])
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                for _ in range(2):
                    run()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(4):
                    run()
            g.replay()
            graphs[var] = (g, run)
        torch.cuda.synchronize()
        times = {v: [] for v in variants}
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            for var in variants:
                t0.record()
                graphs[var][0].replay()
                t1.record()
                t1.synchronize()
                times[var].append(t0.elapsed_time(t1) / 4)
        for var in variants:
            med = statistics.median(times[var])
            res.add(section="moe_gluon_interleaved", E=E, T=T, balanced=balanced, variant=var, reps=reps,
                    layer_ms_graph_il=med, min_ms=min(times[var]), max_ms=max(times[var]),
                    tflops_useful_il=_flop(T) / med / 1e9)
        del graphs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--compile", action="store_true", help="sm_90 compile report only (no GPU)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--balanced-variants", default="gluon64,gluon128")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--experts", default="32,128", help="expert counts (one layer shape each)")
    ap.add_argument("--trace-variants", default="", help="bm-128 variants also run once with the per-tile trace")
    ap.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timings (*_ms_graph)")
    ap.add_argument("--interleave", default="", help="variants whose layer graphs are also timed in turns")
    ap.add_argument("--interleave-reps", type=int, default=40)
    args = ap.parse_args()
    if args.compile:
        return compile_check(args.out, args.variants.split(",") if args.variants != DEFAULT_VARIANTS else None)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import Results

    res = Results(os.environ.get("MOE_GLUON_NAME", "moe-gluon"))
    for E in (int(e) for e in args.experts.split(",")):
        res.section(f"moe_gluon_E{E}", moe_layer, E, args.tokens, [v for v in args.variants.split(",") if v],
                    [v for v in args.balanced_variants.split(",") if v], tuple(args.trace_variants.split(",")),
                    not args.no_graph)
        res.write(args.out or ".")
        if args.interleave:
            res.section(f"moe_gluon_interleaved_E{E}", interleaved, E, args.tokens,
                        [v for v in args.interleave.split(",") if v], args.interleave_reps)
            res.write(args.out or ".")
    print("wrote", res.write(args.out or "."), "errors:", len(res.errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
