"""Dense FP8 linear and fused-MoE kernel benchmarks on one GPU, with same-run anchors.

    PYTHONPATH=shared python bench/moe/bench_kernels.py --out DIR [--quick]

Writes DIR/moe-kernels.json (rows + run metadata). Sections: ceilings (copy, cuBLAS FP8 block
GEMM 8192^3), dense linear (qkv/o/lm_head shapes; cuBLAS blockwise vs Triton; weight-only small M),
MoE prefill (T=8192, 20B and 120B expert counts, tile variants, per-stage breakdown, anchors:
torch._grouped_mm bf16, torch._scaled_grouped_mm FP8 rowwise, HF GptOssExperts grouped_mm),
MoE small-T sweep (both paths; bandwidth on the expert bytes actually touched), moe_prefill_v2 (the
large-M kernel variants of triton_moe_gemm_large vs the previous default, each output checked against
the torch FP8 reference; anchor: torch's blockwise FP8 grouped GEMM where this torch offers it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import COPY_TBS, DEVICE, Results, median_ms, random_experts, random_linear, routing  # noqa: E402

from dayzero.kernels import triton_linear as TL  # noqa: E402
from dayzero.kernels import torch_ops  # noqa: E402
from dayzero.kernels.triton_moe import LARGE, LARGE_V1, SMALL, TINY, MoeRun, default_tiles  # noqa: E402

H = I = 2880
K_TOP = 4
LIMIT = 7.0


def ceilings(res: Results) -> None:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a))
    res.add(section="ceiling", name="copy_1GiB", ms=ms, tbs=2 * a.numel() / ms / 1e9)
    del a, b
    n = 8192
    lw = random_linear(n, n, seed=1)
    q, s_t = TL.quantize_rows(torch.randn(n, n, device="cuda").bfloat16())
    ms = median_ms(lambda: TL.gemm_fp8_cublas(q, s_t, lw))
    res.add(section="ceiling", name="cublas_fp8_block_8192^3", ms=ms, tflops=2 * n**3 / ms / 1e9)


LINEAR_SHAPES = {"q": (4096, 2880), "qkv": (5120, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)}


def dense_linear(res: Results, quick: bool) -> None:
    for name, (n, k) in LINEAR_SHAPES.items():
        lw = random_linear(n, k, seed=n)
        for m in ((8192,) if quick else (8192,)):
            x = torch.randn(m, k, device="cuda").bfloat16()
            q, s_t = TL.quantize_rows(x)
            flop = 2 * m * n * k
            variants = {
                "quant_1x128": lambda: TL.quantize_rows(x),
                "cublas_block": lambda: TL.gemm_fp8_cublas(q, s_t, lw),
                "triton_tma_128x128_s3": lambda: TL.gemm_fp8_triton(q, s_t, lw, tma=True),
                "triton_ptr_128x128_s3": lambda: TL.gemm_fp8_triton(q, s_t, lw, tma=False),
                "linear_op_total": lambda: TL.linear(x, lw),
            }
            for var, fn in variants.items():
                ms = median_ms(fn)
                row = dict(section="linear_prefill", shape=name, M=m, N=n, K=k, variant=var, ms=ms)
                if var != "quant_1x128":
                    row["tflops"] = flop / ms / 1e9
                if var == "cublas_block":
                    row["bias_in_gemm"] = lw.derived["triton_fp8"].bias_in_gemm
                res.add(**row)
        wbytes = n * k + lw.scale.numel() * 4
        for m in (1, 8, 64):
            x = torch.randn(m, k, device="cuda").bfloat16()
            q, s_t = TL.quantize_rows(x)
            for var, fn in {"w8a16_triton_auto_split": lambda: TL.gemm_w8a16_triton(x, lw),
                            "w8a16_triton_no_split": lambda: TL.gemm_w8a16_triton(x, lw, split_k=1),
                            "w8a16_triton_bn32": lambda: TL.gemm_w8a16_triton(x, lw, bn=32),
                            "cublas_block_prequant": lambda: TL.gemm_fp8_cublas(q, s_t, lw),
                            "triton_fp8_prequant_64x64": lambda: TL.gemm_fp8_triton(q, s_t, lw, bm=64, bn=64, warps=4),
                            "linear_op_total": lambda: TL.linear(x, lw)}.items():
                ms = median_ms(fn)
                res.add(section="linear_decode", shape=name, M=m, N=n, K=k, variant=var, ms=ms,
                        tbs=wbytes / ms / 1e9, frac_copy=wbytes / ms / 1e9 / COPY_TBS)
        del lw


def _flop(T: int) -> float:
    return 6.0 * T * K_TOP * H * I  # gate_up 2*T*k*2I*H + down 2*T*k*H*I


PREFILL_VARIANTS = {
    "default": LARGE,                                               # x quantized into sorted order, A via TMA
    "v1": LARGE_V1,                                                 # previous default (moe_gemm_kernel)
    "gather_a_ptr": dataclasses.replace(LARGE, gather_quant=False),  # pointer gather of x (moe_gemm_kernel)
    "stages4": dataclasses.replace(LARGE, stages=4),
    "group8": dataclasses.replace(LARGE, group_m=8),
    "down_w8": dataclasses.replace(LARGE, warps_down=8),
}


def moe_prefill(res: Results, E: int, T: int, quick: bool) -> None:
    ex = random_experts(E, H, I, seed=E)
    x = torch.randn(T, H, device="cuda").bfloat16()
    for balanced in (True, False):
        w, ids = routing(T, E, K_TOP, balanced, seed=T)
        variants = {"default": LARGE} if (quick or balanced) else PREFILL_VARIANTS
        for var, tiles in variants.items():
            run = MoeRun(x, w, ids, ex, LIMIT, tiles=tiles, small=False)
            ms = median_ms(run)
            res.add(section="moe_prefill", E=E, T=T, balanced=balanced, variant=var, ms=ms,
                    tflops_useful=_flop(T) / ms / 1e9)
            if var == "default":  # per-stage breakdown on the same buffers
                run()
                for stage in MoeRun.STAGES:
                    sms = median_ms(getattr(run, stage))
                    row = dict(section="moe_prefill_stage", E=E, T=T, balanced=balanced, stage=stage, ms=sms)
                    if stage in ("gate_up", "down"):
                        row["tflops"] = (_flop(T) * (2 / 3 if stage == "gate_up" else 1 / 3)) / sms / 1e9
                    res.add(**row)
            del run
    res.section(f"anchors_E{E}", anchors, ex, T)


def anchors(res: Results, ex, T: int) -> None:
    """Same weights, balanced routing (T*k/E rows per expert): torch grouped GEMMs and HF's experts."""
    from dayzero.weights import fp8

    E = ex.num_experts
    P = T * K_TOP
    offs = (torch.arange(1, E + 1, device="cuda") * (P // E)).to(torch.int32)
    xs = torch.randn(P, H, device="cuda").bfloat16()
    w1 = torch.stack([fp8.dequantize_weight_block(ex.gate_up[e], ex.gate_up_scale[e]).bfloat16() for e in range(E)])
    w2 = torch.stack([fp8.dequantize_weight_block(ex.down[e], ex.down_scale[e]).bfloat16() for e in range(E)])
    gu_flop, dn_flop = 2.0 * P * H * 2 * I, 2.0 * P * I * H

    def act(gu):
        gate, up = gu[:, ::2].clamp(max=LIMIT), gu[:, 1::2].clamp(-LIMIT, LIMIT)
        return ((up + 1) * gate * torch.sigmoid(1.702 * gate)).bfloat16()

    ms = median_ms(lambda: torch._grouped_mm(xs, w1.transpose(1, 2), offs=offs))
    res.add(section="anchor", E=E, T=T, name="grouped_mm_bf16_gate_up", ms=ms, tflops=gu_flop / ms / 1e9)
    ms = median_ms(lambda: torch._grouped_mm(act(torch._grouped_mm(xs, w1.transpose(1, 2), offs=offs)),
                                             w2.transpose(1, 2), offs=offs))
    res.add(section="anchor", E=E, T=T, name="grouped_mm_bf16_moe_with_act", ms=ms,
            tflops=(gu_flop + dn_flop) / ms / 1e9)
    # FP8 rowwise: one scale per activation row and per weight output row
    sa = xs.float().abs().amax(1).clamp(min=1e-12) / 448
    xq = (xs.float() / sa[:, None]).to(torch.float8_e4m3fn)
    sb = w1.float().abs().amax(2).clamp(min=1e-12) / 448                      # [E, 2I]
    w1q = (w1.float() / sb[..., None]).to(torch.float8_e4m3fn)
    ms = median_ms(lambda: torch._scaled_grouped_mm(xq, w1q.transpose(1, 2), sa, sb, offs=offs,
                                                    out_dtype=torch.bfloat16))
    res.add(section="anchor", E=E, T=T, name="scaled_grouped_mm_fp8_rowwise_gate_up", ms=ms, tflops=gu_flop / ms / 1e9)
    del xq, w1q
    res.section(f"hf_experts_E{E}", hf_experts, ex, w1, w2, T)


def hf_experts(res: Results, ex, w1, w2, T: int) -> None:
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    E = ex.num_experts
    cfg = GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K_TOP)
    cfg._experts_implementation = "grouped_mm"
    with torch.device("cuda"):
        mod = GptOssExperts(cfg).to(torch.bfloat16)
    mod.gate_up_proj.data = w1.transpose(1, 2).contiguous()                  # HF keeps (in, out)
    mod.gate_up_proj_bias.data = ex.gate_up_bias.clone()
    mod.down_proj.data = w2.transpose(1, 2).contiguous()
    mod.down_proj_bias.data = ex.down_bias.clone()
    x = torch.randn(T, H, device="cuda").bfloat16()
    w, ids = routing(T, E, K_TOP, True, seed=T)
    with torch.no_grad():
        ms = median_ms(lambda: mod(x, ids, w))
        ours = MoeRun(x, w, ids, ex, LIMIT, small=False)()
        hf = mod(x, ids, w)
    rel = ((ours.float() - hf.float()).norm() / hf.float().norm()).item()
    res.add(section="anchor", E=E, T=T, name="hf_gptoss_experts_grouped_mm", ms=ms, tflops_useful=_flop(T) / ms / 1e9,
            rel_err_ours_fp8_vs_hf_bf16=rel)


_r = dataclasses.replace
V2_VARIANTS = {  # large-M configurations (registers / occupancy / results per variant: bench/NOTES.md runs 5-8)
    "v1": LARGE_V1,                # previous default (moe_gemm_kernel); "base" in runs 5-8
    "default": LARGE,              # triton_moe_gemm_large, gu one 64x256 dot w8 s3, dn w4 s3; "v4" in run 8
    "split2_persistent_flatten": _r(LARGE, split_gate_up=2, persistent_gate_up=1),                # run 6 "v2"
    "pipe": _r(LARGE, stages=2, stages_down=3, pipe_gate_up=True, pipe_down=True),              # run 7 "v3"
    "down_persistent2": _r(LARGE, persistent_down=2),
    "rescale_w4s2_persistent2": _r(LARGE, split_gate_up=2, rescale=True, warps_gate_up=4, stages=2, stages_down=3,
                                   persistent_gate_up=2),  # fastest gate_up, fails the accuracy bound
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def moe_prefill_v2(res: Results, E: int, T: int, variants: list[str]) -> None:
    """Whole layer and the two GEMMs per variant, same weights and routing; each output checked
    against the torch FP8 reference (rel) and for unwritten/non-finite elements."""
    ex = random_experts(E, H, I, seed=E)
    x = torch.randn(T, H, device=DEVICE).bfloat16()
    for balanced in (False, True):
        w, ids = routing(T, E, K_TOP, balanced, seed=T)
        ref = torch_ops.moe_experts(x, w, ids, ex, LIMIT)
        for var in (variants if not balanced else [v for v in variants if v in ("v1", "default")]):
            run = MoeRun(x, w, ids, ex, LIMIT, tiles=V2_VARIANTS[var], small=False)
            run.out.fill_(float("nan"))
            run.y.fill_(float("nan"))                                             # every pair's row must be written
            out = run().clone()
            ms = median_ms(run)
            row = dict(section="moe_prefill_v2", E=E, T=T, balanced=balanced, variant=var, ms=ms,
                       tflops_useful=_flop(T) / ms / 1e9, finite=bool(torch.isfinite(out).all()),
                       rel_vs_torch_ref=_rel(out, ref), large_kernel=run._large())
            for stage, frac in (("gate_up", 2 / 3), ("down", 1 / 3)):
                sms = median_ms(getattr(run, stage))
                row[f"{stage}_ms"], row[f"{stage}_tflops"] = sms, _flop(T) * frac / sms / 1e9
            if var == "default":
                for stage in ("align", "quant", "combine"):
                    row[f"{stage}_ms"] = median_ms(getattr(run, stage))
            res.add(**row)
            del run, out
    res.section(f"anchor_blockwise_grouped_E{E}", blockwise_grouped_anchor, ex, T)


def blockwise_grouped_anchor(res: Results, ex, T: int) -> None:
    """torch's FP8 grouped GEMM with 1x128 x 128x128 block scales (if this torch offers it on sm90):
    gate_up shapes, balanced routing, K zero-padded to a multiple of 128."""
    import torch.nn.functional as F

    E, P = ex.num_experts, T * K_TOP
    kp = -(-H // 128) * 128
    offs = (torch.arange(1, E + 1, device=DEVICE) * (P // E)).to(torch.int32)
    xq = torch.zeros(P, kp, device=DEVICE, dtype=torch.float8_e4m3fn)
    xq[:, :H] = (torch.randn(P, H, device=DEVICE) * 50).clamp(-440, 440).to(torch.float8_e4m3fn)
    wq = torch.zeros(E, 2 * I, kp, device=DEVICE, dtype=torch.float8_e4m3fn)
    wq[:, :, :H] = ex.gate_up
    sa = torch.rand(P, kp // 128, device=DEVICE) * 1e-3 + 1e-3
    sb = torch.nn.functional.pad(ex.gate_up_scale, (0, kp // 128 - ex.gate_up_scale.shape[-1]), value=1.0)
    BW = F.ScalingType
    attempts = {"sa_rowmajor": (sa, sb), "sa_outer": (sa.t().contiguous().t(), sb),
                "sa_outer_sb_t": (sa.t().contiguous().t(), sb.transpose(1, 2).contiguous().transpose(1, 2))}
    errors = {}
    for name, (a_s, b_s) in attempts.items():
        fn = (lambda a_s=a_s, b_s=b_s: F.scaled_grouped_mm(xq, wq.transpose(1, 2), a_s, BW.BlockWise1x128, b_s,
                                                          BW.BlockWise128x128, offs=offs, output_dtype=torch.bfloat16))
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as exc:  # record why this torch refuses it
            errors[name] = repr(exc)[:300]
            continue
        ms = median_ms(fn)
        res.add(section="anchor", E=E, T=T, name="scaled_grouped_mm_fp8_blockwise_gate_up", layout=name, ms=ms,
                tflops=2.0 * P * H * 2 * I / ms / 1e9)
        return
    res.add(section="anchor", E=E, T=T, name="scaled_grouped_mm_fp8_blockwise_gate_up", unsupported=errors)


def moe_sweep(res: Results, E: int, quick: bool) -> None:
    ex = random_experts(E, H, I, seed=E + 1)
    per_expert = 2 * I * H + H * I + 4 * (ex.gate_up_scale[0].numel() + ex.down_scale[0].numel()) + 2 * (3 * I + H)
    Ts = (1, 4, 16, 64, 256, 1024) if quick else (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    for T in Ts:
        x = torch.randn(T, H, device="cuda").bfloat16()
        w, ids = routing(T, E, K_TOP, False, seed=T + 7)
        touched = int(torch.unique(ids).numel())
        paths = {"small": (True, default_tiles(T * K_TOP, True)), "large": (False, LARGE)}
        if T in (1, 4, 16, 64):
            paths["small_bn64"] = (True, SMALL)
            paths["small_bn32"] = (True, TINY)
            paths["small_bn16"] = (True, dataclasses.replace(TINY, bn_gate_up=16, bn_down=16))
        for name, (small, tiles) in paths.items():
            run = MoeRun(x, w, ids, ex, LIMIT, tiles=tiles, small=small)
            ms = median_ms(run)
            gbs = touched * per_expert / ms / 1e6
            res.add(section="moe_sweep", E=E, T=T, path=name, ms=ms, experts_touched=touched,
                    tbs_touched=gbs / 1e3, frac_copy=gbs / 1e3 / COPY_TBS, tflops_useful=_flop(T) / ms / 1e9)
        if T in (1, 64, 8192 // K_TOP):
            run = MoeRun(x, w, ids, ex, LIMIT, small=T < 1024)
            run()
            for stage in MoeRun.STAGES:
                res.add(section="moe_sweep_stage", E=E, T=T, path="small" if run.small else "large", stage=stage,
                        ms=median_ms(getattr(run, stage)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="ceilings,linear,moe_prefill,moe_sweep")
    ap.add_argument("--variants", default=",".join(V2_VARIANTS), help="moe_prefill_v2: variants to time")
    args = ap.parse_args()
    res = Results("moe-kernels")
    want = set(args.sections.split(","))
    if "ceilings" in want:
        res.section("ceilings", ceilings)
    if "linear" in want:
        res.section("linear", dense_linear, args.quick)
    for E in (32, 128):
        if "moe_prefill" in want:
            res.section(f"moe_prefill_E{E}", moe_prefill, E, 8192, args.quick)
        if "moe_prefill_v2" in want:
            res.section(f"moe_prefill_v2_E{E}", moe_prefill_v2, E, 8192, args.variants.split(","))
            res.write(args.out)  # keep what is done if a later section runs out of time
        if "moe_sweep" in want:
            res.section(f"moe_sweep_E{E}", moe_sweep, E, args.quick)
    print("wrote", res.write(args.out), "errors:", len(res.errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
