"""Triton fused MoE (GPT-OSS experts) and router top-k, registered as the ``triton`` backend's
``moe_experts`` and ``router_topk``.

Pipeline for T tokens, top-k, E experts, hidden H, expert width I (P = T * k pairs):
  1. align: sort pairs by expert, pad each expert's run to the M block (triton_moe_align).
  2. gate_up GEMM grouped over experts (A = x rows of the sorted pairs), epilogue
     ``+ b1``, clamped SwiGLU on the interleaved gate/up columns -> h [Mpad, I].
  3. down GEMM over h (sorted rows), epilogue ``(+ b2) * routing weight``, rows scattered back to
     pair order -> y [P, H] bf16.
  4. combine: out[t] = sum of y over the token's routes that this rank owns (fp32, one pass).
Expert parallel: ``experts.derived["expert_offset"]`` is the first global id of the local slice;
routes to other ranks' experts are skipped (the caller all-reduces over EP ranks).
Two paths (kernel in triton_moe_gemm):
  * large M (prefill): x quantized 1x128 straight into the expert-sorted row order (so gate_up
    reads A, like B, by TMA); FP8 x FP8 tensor-core GEMMs with per-128-K-step block scaling
    (triton_moe_gemm_large; moe_gemm_kernel where TMA cannot take the operands); h is quantized to
    FP8 (1x128) inside the gate_up epilogue (tile N = 256 = one 128-wide h group).
    On Hopper the registered op runs both large-M GEMMs on the Gluon warp-specialised kernels instead
    (``gluon_prefill``; same numerics): 64-row tiles (``gluon_moe_gemm``, 13-15 % faster per layer), or
    128-row tiles sharing the weight tile (``gluon_moe_gemm128``, dynamically scheduled, with the fused
    align + quantization glue) from 256 routed rows per expert on average (``gluon_moe_gemm_run.config_for``;
    20B and 120B prefill at 8192 tokens).
  * small M (decode, bandwidth bound): bf16 activations x FP8 weights widened in registers; h stays
    bf16. Every touched expert's weights are read once per N tile.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .registry import REGISTRY, register
from .triton_linear import GROUP, quantize_gathered_rows, quantize_rows
from .triton_moe_align import AlignedPairs, align_pairs, max_padded_rows
from .triton_moe_gemm import interpreting, moe_combine_kernel, moe_gemm_kernel, tma_ok
from .triton_moe_gemm_large import moe_gemm_large_kernel
from .triton_moe_router import router_topk as _router_topk
from .triton_moe_small_split import moe_split, takes_split
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
    gather_quant: bool = False  # FP8 path: quantize x straight into sorted row order, gate_up A via TMA
    # FP8 path on triton_moe_gemm_large (needs gather_quant and TMA-aligned operands, else the kernel above):
    large_kernel: bool = False
    split_gate_up: int = 1       # 2: the 256-wide gate_up tile as two 128-wide dots (per-row scales)
    split_down: int = 1
    rescale: bool = False        # one register tile per accumulator; less accurate (see triton_moe_gemm_large)
    stages_down: int = 0         # 0: same as stages
    persistent_gate_up: int = 0  # programs per SM walking the tiles (0: one program per tile)
    persistent_down: int = 0
    flatten: bool = True         # persistent: fuse tile and K loops (loads of the next tile overlap the epilogue)
    pipe_gate_up: bool = False   # issue the dots of K step k+1 before step k's scale promotion
    pipe_down: bool = False


# Large-M (prefill) default, bench/NOTES.md runs 5-8: gate_up one 64x256 dot (8 warps, 3 stages, 215 regs),
# down 64x128 (4 warps, 150 regs: 3 CTAs per SM), both on triton_moe_gemm_large; 5 % faster than LARGE_V1.
LARGE = MoeTiles(bm=64, bn_gate_up=256, bn_down=128, warps_gate_up=8, warps_down=4, stages=3, group_m=16, tma=True,
                 gather_quant=True, large_kernel=True, split_gate_up=1)
LARGE_V1 = dataclasses.replace(LARGE, large_kernel=False)  # the previous default: moe_gemm_kernel for both GEMMs
SMALL = MoeTiles(bm=16, bn_gate_up=64, bn_down=64, warps_gate_up=4, warps_down=4, stages=4, group_m=1)
TINY = MoeTiles(bm=16, bn_gate_up=32, bn_down=32, warps_gate_up=4, warps_down=4, stages=4, group_m=1)
TINY_PAIRS = 64  # at most this many (token, expert) pairs: narrower N tiles so enough programs stream weights


def default_tiles(num_pairs: int, small: bool) -> MoeTiles:
    if not small:
        return LARGE
    return TINY if num_pairs <= TINY_PAIRS else SMALL


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


def _gemm_large(a, a_scale_t, w, w_scale, bias, out, out_scale_t, al: AlignedPairs, weights, *, K, N, epi, bn,
                split, warps, stages, group_m, rescale, persistent, flatten, pipe, limit) -> None:
    """FP8 x FP8 grouped GEMM on triton_moe_gemm_large (A and W through TMA descriptors)."""
    nbm = al.padded_rows // al.block_m
    if persistent:
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
        progs = persistent * sms
    else:
        progs = nbm * triton.cdiv(N, bn)
    moe_gemm_large_kernel[(progs,)](
        TensorDescriptor.from_tensor(a, [al.block_m, GROUP]), a_scale_t,
        TensorDescriptor.from_tensor(w, [1, bn // split, GROUP]), w_scale, bias, out,
        out_scale_t if out_scale_t is not None else out, al.sorted_ids, al.block_expert, weights,
        nbm, N, K, al.num_pairs, a_scale_t.stride(0), w_scale.stride(0), w_scale.stride(1), bias.stride(0),
        out.stride(0), out_scale_t.stride(0) if out_scale_t is not None else 0, float(limit), SWIGLU_ALPHA,
        EPI=epi, SPLIT_N=split, BM=al.block_m, BN=bn, BK=GROUP, GROUP_M=group_m, PERSISTENT=bool(persistent),
        NUM_PROGS=progs if persistent else 1, FLATTEN=flatten, RESCALE=rescale, PIPE=pipe,
        DOT_F32=interpreting(),
        num_warps=warps, num_stages=stages,
    )


class MoeRun:
    """One fused-MoE call split into its stages (``align``, ``quant``, ``gate_up``, ``down``,
    ``combine``), each re-runnable on the buffers allocated here (the bench times them one by one).
    ``fused_moe`` runs them in order."""

    def __init__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                 limit: float, tiles: MoeTiles | None = None, small: bool | None = None) -> None:
        T, H, E, I = experts.check_call(x, weights, ids)
        self.k = k = ids.shape[1]
        self.T, self.H, self.I, self.E = T, H, I, E
        if small is None:
            small = T * k < SMALL_ROWS_PER_EXPERT * E
        self.small = small
        self.tiles = tiles = tiles or default_tiles(T * k, small)
        if not small and tiles.bn_gate_up != 2 * GROUP:
            raise ValueError("the FP8 gate_up epilogue quantizes h per 128 columns: bn_gate_up must be 256")
        if tiles.large_kernel and any(128 % (bn // sp) and (bn // sp != 256 or tiles.rescale or sp != 1)
                                      for bn, sp in ((tiles.bn_gate_up, tiles.split_gate_up),
                                                     (tiles.bn_down, tiles.split_down))):
            raise ValueError("large kernel: every dot's N width (bn // split) must divide 128 (or be 256, unsplit,"
                             " without rescale)")
        self.x, self.ids, self.weights, self.experts, self.limit = x.contiguous(), ids.contiguous(), \
            weights.contiguous(), experts, limit
        self.offset = int(experts.derived.get("expert_offset", 0))
        dev = x.device
        rows = max_padded_rows(T * k, E, tiles.bm)
        self.h = torch.empty((rows, I), dtype=torch.bfloat16 if small else torch.float8_e4m3fn, device=dev)
        self.hs_t = None if small else torch.empty((triton.cdiv(I, GROUP), rows), dtype=torch.float32, device=dev)
        self.y = torch.empty((T * k, H), dtype=x.dtype, device=dev)                # per-route outputs
        self.out = torch.empty((T, H), dtype=x.dtype, device=dev)
        self.al: AlignedPairs | None = None
        self.xq, self.xs_t = self.x, None

    def _common(self) -> dict:
        t = self.tiles
        return dict(limit=self.limit, stages=t.stages, group_m=t.group_m, tma=t.tma)

    def align(self) -> None:
        self.al = align_pairs(self.ids, self.E, self.tiles.bm, self.offset)

    def quant(self) -> None:
        if self.small:
            return
        if self.tiles.gather_quant:                                              # [Mpad, Hp], [ceil(H/128), Mpad]
            al = self.al
            self.xq, self.xs_t = quantize_gathered_rows(self.x, al.sorted_ids, al.block_expert, al.num_pairs,
                                                        self.k, al.block_m)
        else:
            self.xq, self.xs_t = quantize_rows(self.x)                           # [T, Hp], [ceil(H/128), T]

    def _large(self) -> bool:
        """Whether the FP8 GEMMs run on triton_moe_gemm_large (TMA-aligned operands only)."""
        ex, t = self.experts, self.tiles
        return (not self.small and t.large_kernel and t.gather_quant and t.tma
                and tma_ok(self.xq, self.h, ex.gate_up, ex.down))

    def gate_up(self) -> None:
        ex, t = self.experts, self.tiles
        if self._large():
            _gemm_large(self.xq, self.xs_t, ex.gate_up, ex.gate_up_scale, ex.gate_up_bias, self.h, self.hs_t, self.al,
                        self.weights, K=self.H, N=2 * self.I, epi=1, bn=t.bn_gate_up, split=t.split_gate_up,
                        warps=t.warps_gate_up, stages=t.stages, group_m=t.group_m, rescale=t.rescale,
                        persistent=t.persistent_gate_up, flatten=t.flatten, pipe=t.pipe_gate_up, limit=self.limit)
            return
        _gemm(self.xq, self.xs_t, ex.gate_up, ex.gate_up_scale, ex.gate_up_bias, self.h, self.hs_t, self.al,
              self.weights, self.k, K=self.H, N=2 * self.I, gather=self.small or not t.gather_quant, scatter=False,
              a_fp8=not self.small,
              epi=1, quant_out=not self.small, bn=t.bn_gate_up, warps=t.warps_gate_up, **self._common())

    def down(self) -> None:
        ex, t = self.experts, self.tiles
        if self._large():
            _gemm_large(self.h, self.hs_t, ex.down, ex.down_scale, ex.down_bias, self.y, None, self.al, self.weights,
                        K=self.I, N=self.H, epi=2, bn=t.bn_down, split=t.split_down, warps=t.warps_down,
                        stages=t.stages_down or t.stages, group_m=t.group_m, rescale=t.rescale,
                        persistent=t.persistent_down, flatten=t.flatten, pipe=t.pipe_down, limit=self.limit)
            return
        _gemm(self.h, self.hs_t, ex.down, ex.down_scale, ex.down_bias, self.y, None, self.al, self.weights,
              self.k, K=self.I, N=self.H, gather=False, scatter=True, a_fp8=not self.small, epi=2,
              quant_out=False, bn=t.bn_down, warps=t.warps_down, **self._common())

    def combine(self) -> None:
        bh = 1024
        moe_combine_kernel[(self.T, triton.cdiv(self.H, bh))](
            self.y, self.ids, self.out, self.H, self.offset, self.E, TOPK=self.k, BH=bh, num_warps=4)

    STAGES = ("align", "quant", "gate_up", "down", "combine")

    def __call__(self) -> torch.Tensor:
        if self.T:
            for name in self.STAGES:
                getattr(self, name)()
        return self.out


def fused_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
              limit: float, tiles: MoeTiles | None = None, small: bool | None = None) -> torch.Tensor:
    """x [T, H] bf16, weights/ids [T, k] -> [T, H] bf16 (path and tiles chosen unless given)."""
    return MoeRun(x, weights, ids, experts, limit, tiles, small)()


@register("triton", "moe_experts")
def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                limit: float) -> torch.Tensor:
    """(x [T,H], weights [T,k], ids [T,k], experts, limit) -> [T,H]; bf16 experts use the torch op."""
    if not experts.is_fp8:
        return REGISTRY.impls["torch"]["moe_experts"](x, weights, ids, experts, limit)
    if experts.gate_up_scale is None or experts.down_scale is None:
        raise ValueError("fp8 experts need gate_up_scale and down_scale")
    if x.dtype == torch.bfloat16 and takes_split(ids.numel(), experts.num_experts):  # decode sizes (bench/NOTES.md)
        return moe_split(x, weights, ids, experts, limit)
    if gluon_prefill(x, ids, experts.num_experts):
        try:
            from .gluon_moe_gemm_run import config_for, fused_moe_gluon
        except ImportError:  # a triton without Gluon
            return fused_moe(x, weights, ids, experts, limit)
        return fused_moe_gluon(x, weights, ids, experts, limit, config_for(ids.numel(), experts.num_experts))
    return fused_moe(x, weights, ids, experts, limit)


def gluon_prefill(x: torch.Tensor, ids: torch.Tensor, num_experts: int) -> bool:
    """Whether a call's large-M GEMMs run on the Gluon warp-specialised kernels (gluon_moe_gemm and
    gluon_moe_gemm128, DeepGEMM's structure; bench/NOTES.md "MoE prefill in Gluon"): on Hopper (sm_90)
    for large-M calls, unless DAYZERO_MOE_GLUON=0 (DAYZERO_MOE_GLUON_BM=64|128 forces the tile rows)."""
    if os.environ.get("DAYZERO_MOE_GLUON", "1") == "0" or not x.is_cuda or interpreting():
        return False
    if ids.numel() < SMALL_ROWS_PER_EXPERT * num_experts:                  # MoeRun's small-M path
        return False
    return torch.cuda.get_device_capability(x.device) == (9, 0)


@register("triton", "router_topk")
def router_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [T,E], k) -> (weights [T,k] bf16 when logits are bf16, ids [T,k] int64)."""
    return _router_topk(logits, k)
