"""Triton fused MoE (GPT-OSS experts) and router top-k, registered as the ``triton`` backend's
``moe_experts`` and ``router_topk``.

Pipeline for T tokens, top-k, E experts, hidden H, expert width I (P = T * k pairs):
  1. align: sort pairs by expert, pad each expert's run to the M block (triton_moe_align).
  2. gate_up GEMM grouped over experts, A rows gathered by token (no gathered copy of x), epilogue
     ``+ b1``, clamped SwiGLU on the interleaved gate/up columns -> h [Mpad, I].
  3. down GEMM over h (sorted rows), epilogue ``(+ b2) * routing weight``, rows scattered back to
     pair order -> y [P, H] bf16.
  4. combine: out[t] = sum of y over the token's routes that this rank owns (fp32, one pass).
Expert parallel: ``experts.derived["expert_offset"]`` is the first global id of the local slice;
routes to other ranks' experts are skipped (the caller all-reduces over EP ranks).
Two paths (kernel in triton_moe_gemm):
  * large M (prefill): x quantized per token 1x128 once; FP8 x FP8 tensor-core GEMMs with
    per-128-K-step block scaling; h is quantized to FP8 (1x128) inside the gate_up epilogue.
  * small M (decode, bandwidth bound): bf16 activations x FP8 weights widened in registers; h stays
    bf16. Every touched expert's weights are read once per N tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .registry import REGISTRY, register
from .triton_linear import GROUP, quantize_rows
from .triton_moe_align import AlignedPairs, align_pairs
from .triton_moe_gemm import interpreting, moe_combine_kernel, moe_gemm_kernel, tma_ok
from .triton_moe_router import router_topk as _router_topk
from .types import ExpertWeights

SWIGLU_ALPHA = 1.702
SMALL_ROWS_PER_EXPERT = 16  # mean pairs per expert below which the small-M path runs (bench/NOTES.md)


@dataclass(frozen=True)
class MoeTiles:
    """Launch configuration of one path (both GEMMs)."""

    bm: int
    bn_gate_up: int
    bn_down: int
    warps_gate_up: int
    warps_down: int
    stages: int
    group_m: int
    tma: bool = False  # weights (and the down GEMM's contiguous A) through TMA descriptors


LARGE = MoeTiles(bm=64, bn_gate_up=256, bn_down=128, warps_gate_up=8, warps_down=4, stages=3, group_m=16, tma=True)
SMALL = MoeTiles(bm=16, bn_gate_up=64, bn_down=64, warps_gate_up=4, warps_down=4, stages=4, group_m=1)


def _gemm(a, a_scale_t, w, w_scale, bias, out, out_scale_t, al: AlignedPairs, weights, topk, *,
          K, N, gather, scatter, a_fp8, epi, quant_out, limit, bn, warps, stages, group_m, tma):
    grid = (triton.cdiv(al.padded_rows, al.block_m) * triton.cdiv(N, bn),)
    b_tma = tma and a_fp8 and tma_ok(w)
    a_tma = b_tma and not gather and tma_ok(a)
    a_arg = TensorDescriptor.from_tensor(a, [al.block_m, GROUP]) if a_tma else a
    b_arg = TensorDescriptor.from_tensor(w, [1, bn, GROUP]) if b_tma else w
    moe_gemm_kernel[grid](
        a_arg, a_scale_t if a_scale_t is not None else w_scale, b_arg, w_scale, bias, out,
        out_scale_t if out_scale_t is not None else out,
        al.sorted_ids, al.block_expert, weights,
        al.padded_rows, N, K, al.num_pairs,
        a.stride(0), a_scale_t.stride(0) if a_scale_t is not None else 0,
        w.stride(0), w.stride(1), w_scale.stride(0), w_scale.stride(1), bias.stride(0),
        out.stride(0), out_scale_t.stride(0) if out_scale_t is not None else 0,
        float(limit), SWIGLU_ALPHA,
        TOPK=topk, ROUTED=True, GATHER_A=gather, SCATTER_C=scatter, A_FP8=a_fp8, EPI=epi,
        QUANT_OUT=quant_out, HAS_BIAS=True, BM=al.block_m, BN=bn, BK=GROUP, GROUP_M=group_m,
        num_warps=warps, num_stages=stages, A_TMA=a_tma, B_TMA=b_tma, DOT_F32=interpreting(),
    )


def fused_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
              limit: float, tiles: MoeTiles | None = None, small: bool | None = None) -> torch.Tensor:
    """x [T, H] bf16, weights/ids [T, k] -> [T, H] bf16 (path and tiles chosen unless given)."""
    T, H = x.shape
    k = ids.shape[1]
    E, two_i, h_in = experts.gate_up.shape
    I = two_i // 2
    if h_in != H or experts.down.shape != (E, H, I) or weights.shape != ids.shape or ids.shape[0] != T:
        raise ValueError(f"moe shapes disagree: x {tuple(x.shape)}, ids {tuple(ids.shape)}, weights "
                         f"{tuple(weights.shape)}, gate_up {tuple(experts.gate_up.shape)}, down {tuple(experts.down.shape)}")
    out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    if small is None:
        small = T * k < SMALL_ROWS_PER_EXPERT * E
    tiles = tiles or (SMALL if small else LARGE)
    offset = int(experts.derived.get("expert_offset", 0))
    al = align_pairs(ids, E, tiles.bm, offset)
    weights = weights.contiguous()
    x = x.contiguous()
    y = torch.empty((T * k, H), dtype=x.dtype, device=x.device)
    common = dict(limit=limit, stages=tiles.stages, group_m=tiles.group_m, tma=tiles.tma)
    if small:
        h = torch.empty((al.padded_rows, I), dtype=torch.bfloat16, device=x.device)
        _gemm(x, None, experts.gate_up, experts.gate_up_scale, experts.gate_up_bias, h, None, al, weights, k,
              K=H, N=2 * I, gather=True, scatter=False, a_fp8=False, epi=1, quant_out=False,
              bn=tiles.bn_gate_up, warps=tiles.warps_gate_up, **common)
        _gemm(h, None, experts.down, experts.down_scale, experts.down_bias, y, None, al, weights, k,
              K=I, N=H, gather=False, scatter=True, a_fp8=False, epi=2, quant_out=False,
              bn=tiles.bn_down, warps=tiles.warps_down, **common)
    else:
        if tiles.bn_gate_up != 2 * GROUP:
            raise ValueError("the FP8 gate_up epilogue quantizes h per 128 columns: bn_gate_up must be 256")
        xq, xs_t = quantize_rows(x)                                               # [T, Hp], [ceil(H/128), T]
        h = torch.empty((al.padded_rows, I), dtype=torch.float8_e4m3fn, device=x.device)
        hs_t = torch.empty((triton.cdiv(I, GROUP), al.padded_rows), dtype=torch.float32, device=x.device)
        _gemm(xq, xs_t, experts.gate_up, experts.gate_up_scale, experts.gate_up_bias, h, hs_t, al, weights, k,
              K=H, N=2 * I, gather=True, scatter=False, a_fp8=True, epi=1, quant_out=True,
              bn=tiles.bn_gate_up, warps=tiles.warps_gate_up, **common)
        _gemm(h, hs_t, experts.down, experts.down_scale, experts.down_bias, y, None, al, weights, k,
              K=I, N=H, gather=False, scatter=True, a_fp8=True, epi=2, quant_out=False,
              bn=tiles.bn_down, warps=tiles.warps_down, **common)
    ids = ids.contiguous()
    bh = 1024
    moe_combine_kernel[(T, triton.cdiv(H, bh))](y, ids, out, H, offset, E, TOPK=k, BH=bh, num_warps=4)
    return out


@register("triton", "moe_experts")
def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                limit: float) -> torch.Tensor:
    """(x [T,H], weights [T,k], ids [T,k], experts, limit) -> [T,H]; bf16 experts use the torch op."""
    if not experts.is_fp8:
        return REGISTRY.impls["torch"]["moe_experts"](x, weights, ids, experts, limit)
    if experts.gate_up_scale is None or experts.down_scale is None:
        raise ValueError("fp8 experts need gate_up_scale and down_scale")
    return fused_moe(x, weights, ids, experts, limit)


@register("triton", "router_topk")
def router_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [T,E], k) -> (weights [T,k] bf16 when logits are bf16, ids [T,k] int64)."""
    return _router_topk(logits, k)
