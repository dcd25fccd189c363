"""Host side of the Gluon warp-specialised MoE GEMMs (``gluon_moe_gemm``): launch configuration,
descriptors, and ``GluonMoeRun``, the large-M ``MoeRun`` whose gate_up and down GEMMs run on it.

Everything else of the MoE call (align, quantization into sorted order, combine) is the Triton large
path's (``triton_moe.LARGE``: x quantized 1x128 into sorted order), with align blocks of the kernel's
tile rows: 64 (``gluon_moe_gemm``) or 128 (``GluonConfig.bm = 128``: ``gluon_moe_gemm128``); with
``GluonConfig.glue`` align and quantization run as one step of three launches
(``triton_moe_align.align_quant_pairs``). Operands the kernel cannot take (TMA alignment, non-contiguous
weights) fall back to the Triton GEMMs.
Importing this module imports triton's Gluon: callers import it only when the Gluon path is selected.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gluon_moe_gemm import moe_gemm_ws_kernel
from .gluon_moe_gemm128 import moe_gemm_ws128_kernel
from .triton_moe import LARGE, SWIGLU_ALPHA, MoeRun
from .triton_moe_align import AlignedPairs, align_pairs, align_quant_pairs
from .triton_moe_gemm import tma_ok
from .types import ExpertWeights

BK, BN = 128, 256  # must match gluon_moe_gemm(128)


@dataclass(frozen=True)
class GluonConfig:
    """Launch configuration of both Gluon GEMMs (registers per thread: 12 warps x maxnreg = the budget
    that setmaxnreg redistributes: two consumer warpgroups and the producer's warpgroup)."""

    stages: int = 4            # TMA ring depth: 40 KB (bm 64) / 48 KB (bm 128) of shared memory per stage
    group_m: int = 16          # M blocks walked together per N sweep (L2 reuse of the weight tiles)
    consumer_regs: int = 232
    producer_regs: int = 40
    maxnreg: int = 168
    programs_per_sm: int = 1
    down: bool = True          # False: the down GEMM stays on the Triton large kernel
    diag: int = 0              # timing diagnostics only, WRONG results: 1 = each W tile loaded once per
                               # tile (not per K step), 2 = same for A (bench_gluon); bm 64 only
    bm: int = 64               # tile rows = align block: 64 (gluon_moe_gemm: the consumers split N) or
                               # 128 (gluon_moe_gemm128: the consumers split M and share the W tile)
    half: int = 0              # bm 128, tiles whose rows 64-127 are padding: 0 = the consumers split N,
                               # 1 = warpgroup 0 alone, 2 = split N loading only A's 64 real rows, 3 = 2 with
                               # the W tile loaded once (timing diagnostic, WRONG results) (gluon_moe_gemm128)
    glue: bool = False         # True: align + x quantization in three launches (align_quant_pairs; at 4 pairs a
                               # program 0.07-0.09 ms vs 0.14-0.16, Gluon run 9); False: the Triton path's four
    walk: int = 0              # tile walk: 0 = groups of group_m consecutive M blocks (a group can straddle
                               # two experts), 1 = groups inside each expert's run (AlignedPairs.block_span)
    sched: int = 0             # bm 128: 0 = static round-robin tiles per CTA, 1 = dynamic (a global counter:
                               # the next walk position goes to the first CTA that frees up; gluon_moe_sched)
    fast_epi: bool = False     # bm 128: the gate_up epilogue's sigmoid and h quantization without the range
                               # guards of exp / division (gluon_moe_epi; 17 % fewer epilogue instructions)
    wsplit: bool = False       # bm 128: W as two 128-row TMA boxes, the second skipped past N (last N tile)
    glue_rows: int = 1         # glue: pairs quantized per program of the scatter launch (align_quant_pairs)
    zpad: bool = False         # bm 128: padding rows of h (gate_up epilogue) and, with glue, of the quantized x
                               # written as zeros, not left stale (the GEMMs multiply them; power-capped GPU)


BM64 = GluonConfig()
# 128-row tiles (gluon_moe_gemm128), same rows per M group, tiles handed out by a global counter (sched 1) = the
# session-5 configuration (Gluon run 8)
BM128_RUN8 = dataclasses.replace(BM64, bm=128, group_m=8, sched=1)
# + the gate_up epilogue without range guards, W boxes per weight block, the fused glue at 4 pairs a program (Gluon
# run 9, interleaved CUDA-graph layer times at 8192 tokens against BM128_RUN8 in the same call: 120B random 2.437 ->
# 2.286 ms, balanced 2.172 -> 2.096, 20B random 2.031 -> 1.971, balanced 1.913 -> 1.870; bitwise the same outputs)
BM128 = dataclasses.replace(BM128_RUN8, fast_epi=True, wsplit=True, glue=True, glue_rows=4)
DEFAULT = BM64
# Mean routed rows per local expert from which the registered op takes 128-row tiles (bench/NOTES.md, Gluon
# run 8, CUDA-graph times at 8192 tokens: 120B = 256 rows an expert, random routing 2.686 ms on 64-row tiles
# -> 2.399 on dynamically scheduled 128-row tiles, balanced 2.355 -> 2.119; 20B = 1024 rows, 2.041 -> 1.952).
# Below 256 rows nothing was measured, so the 64-row kernel stays there.
BM128_MIN_ROWS_PER_EXPERT = 256


def config_for(num_pairs: int, num_experts: int) -> GluonConfig:
    """The configuration the registered op runs for a call of ``num_pairs`` routed pairs over
    ``num_experts`` local experts: 128-row tiles from BM128_MIN_ROWS_PER_EXPERT rows an expert on average,
    else 64-row tiles; DAYZERO_MOE_GLUON_BM (64 or 128) forces one."""
    bm = os.environ.get("DAYZERO_MOE_GLUON_BM", "")
    if bm not in ("", "64", "128"):
        raise ValueError(f"DAYZERO_MOE_GLUON_BM must be 64 or 128, got {bm!r}")
    if bm:
        return BM128 if bm == "128" else BM64
    return BM128 if num_pairs >= BM128_MIN_ROWS_PER_EXPERT * num_experts else BM64


def block_scales_by_k(w_scale: torch.Tensor) -> torch.Tensor:
    """w_scale [E, NB, KB] -> [E * KB, NB4] fp32 (NB padded to a multiple of 4 with zeros): the scales of
    one K step's weight blocks side by side, so the producer loads a tile's pair with one 16-byte TMA."""
    E, nb, kb = w_scale.shape
    out = torch.zeros((E, kb, triton.cdiv(nb, 4) * 4), dtype=torch.float32, device=w_scale.device)
    out[:, :, :nb] = w_scale.transpose(1, 2)
    return out.view(E * kb, -1)


def _desc(t: torch.Tensor, block: list[int], dtype) -> TensorDescriptor:
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, dtype))


def gemm_ws(a: torch.Tensor, a_scale_t: torch.Tensor, w: torch.Tensor, w_scale_k: torch.Tensor, bias: torch.Tensor,
            out: torch.Tensor, out_scale_t: torch.Tensor | None, al: AlignedPairs, weights: torch.Tensor, *,
            K: int, N: int, epi: int, limit: float, cfg: GluonConfig = DEFAULT,
            trace: torch.Tensor | None = None) -> None:
    """a [Mpad, >= K] fp8 (sorted rows), a_scale_t [ceil(K/128), Mpad] fp32; w [E, N, K] fp8 contiguous,
    w_scale_k = block_scales_by_k(w_scale); epi 1 -> out = h [Mpad, N/2] fp8 + out_scale_t; epi 2 -> out =
    y [P, N] (pair order). trace (bm 128, diagnostic): int64 [>= tiles, 4] of per-tile start / end ns,
    M block and kind (``gluon_moe_trace._trace``)."""
    bm = cfg.bm
    if bm not in (64, 128) or al.block_m != bm:
        raise ValueError(f"the Gluon MoE GEMM needs {bm}-row align blocks (64 or 128), got {al.block_m}")
    if bm == 128 and cfg.diag:
        raise ValueError("the timing diagnostics exist for the 64-row kernel only")
    if cfg.half not in (0, 1, 2, 3) or (trace is not None and bm != 128):
        raise ValueError(f"half must be 0-3 and a trace needs 128-row tiles (half {cfg.half}, bm {bm})")
    if cfg.walk not in (0, 1) or (cfg.walk == 1 and al.block_span is None):
        raise ValueError(f"walk must be 0 or 1, and walk 1 needs the alignment's block_span (walk {cfg.walk})")
    if cfg.sched not in (0, 1) or (cfg.sched and bm != 128):
        raise ValueError(f"sched must be 0 or 1 (1: 128-row tiles only), got {cfg.sched} with bm {bm}")
    if (cfg.fast_epi or cfg.wsplit or cfg.zpad) and (bm != 128 or (cfg.wsplit and cfg.half == 3)):
        raise ValueError(f"fast_epi / wsplit / zpad need 128-row tiles (wsplit: half 0-2), got bm {bm} half {cfg.half}")
    if not w.is_contiguous():
        raise ValueError("the Gluon MoE GEMM needs contiguous expert weights")
    E = w.shape[0]
    nbm = al.padded_rows // bm
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    progs = max(1, min(cfg.programs_per_sm * sms, nbm * triton.cdiv(N, BN)))
    a_rows = 64 if bm == 128 and cfg.half >= 2 else bm                     # HALF 2 / 3: A as two 64-row boxes
    args = (_desc(a, [a_rows, BK], gl.float8e4nv), _desc(a_scale_t, [1, bm], gl.float32),
            _desc(w.view(E * N, w.shape[2]), [BN // 2 if cfg.wsplit else BN, BK], gl.float8e4nv),
            _desc(w_scale_k, [8, 4], gl.float32),
            bias, out, out_scale_t if out_scale_t is not None else out, al.sorted_ids, al.block_expert, weights,
            nbm, N, K, al.num_pairs, triton.cdiv(K, BK), bias.stride(0), out.stride(0),
            out_scale_t.stride(0) if out_scale_t is not None else 0, float(limit), SWIGLU_ALPHA)
    consts = dict(EPI=epi, STAGES=cfg.stages, GROUP_M=cfg.group_m, CONSUMER_REGS=cfg.consumer_regs,
                  PRODUCER_REGS=cfg.producer_regs, num_warps=4, maxnreg=cfg.maxnreg)
    span = al.block_span if cfg.walk else al.block_expert                  # (unused with walk 0)
    if bm == 128:
        counter = torch.zeros((1, ), dtype=torch.int32, device=a.device) if cfg.sched else al.block_expert
        moe_gemm_ws128_kernel[(progs, )](*args, trace if trace is not None else out, span, counter, HALF=cfg.half,
                                         TRACE=trace is not None, WALK=cfg.walk, SCHED=cfg.sched,
                                         OPT=int(cfg.fast_epi) | 2 * int(cfg.wsplit) | 4 * int(cfg.zpad), **consts)
    else:
        moe_gemm_ws_kernel[(progs, )](*args, span, DIAG=cfg.diag, WALK=cfg.walk, **consts)


class GluonMoeRun(MoeRun):
    """``MoeRun`` on the large-M path with both FP8 GEMMs on the Gluon kernel (stages as in MoeRun)."""

    def __init__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                 limit: float, cfg: GluonConfig = DEFAULT) -> None:
        super().__init__(x, weights, ids, experts, limit, tiles=dataclasses.replace(LARGE, bm=cfg.bm), small=False)
        self.cfg = cfg

    def align(self) -> None:
        span = self.cfg.walk == 1                    # the expert runs of the blocks, for the walk by expert
        if not self.cfg.glue:
            self.al = align_pairs(self.ids, self.E, self.tiles.bm, self.offset, span=span)
            return
        self.al, self.xq, self.xs_t = align_quant_pairs(self.x, self.ids, self.E, self.tiles.bm, self.offset,
                                                        span=span, rows_per_prog=self.cfg.glue_rows,
                                                        zero_pad=self.cfg.zpad)

    def quant(self) -> None:
        if not self.cfg.glue:            # else done by align
            super().quant()

    def gluon_ok(self) -> bool:
        ex = self.experts
        return (self._large() and ex.gate_up.is_contiguous() and ex.down.is_contiguous()
                and tma_ok(self.xs_t, self.hs_t))

    def _scales_by_k(self, name: str) -> torch.Tensor:
        """The expert's weight scales in the kernel's [E * KB, NB4] layout, made once per weight."""
        d = self.experts.derived
        key = f"gluon_{name}_scale_by_k"
        if key not in d:
            d[key] = block_scales_by_k(getattr(self.experts, f"{name}_scale"))
        return d[key]

    def gate_up(self) -> None:
        if not self.gluon_ok():
            return super().gate_up()
        ex = self.experts
        gemm_ws(self.xq, self.xs_t, ex.gate_up, self._scales_by_k("gate_up"), ex.gate_up_bias, self.h, self.hs_t, self.al,
                self.weights, K=self.H, N=2 * self.I, epi=1, limit=self.limit, cfg=self.cfg)

    def down(self) -> None:
        if not (self.cfg.down and self.gluon_ok()):
            return super().down()
        ex = self.experts
        gemm_ws(self.h, self.hs_t, ex.down, self._scales_by_k("down"), ex.down_bias, self.y, None, self.al, self.weights,
                K=self.I, N=self.H, epi=2, limit=self.limit, cfg=self.cfg)


def fused_moe_gluon(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                    limit: float, cfg: GluonConfig = DEFAULT) -> torch.Tensor:
    """x [T, H] bf16, weights/ids [T, k] -> [T, H] bf16 on the large-M path with the Gluon GEMMs."""
    return GluonMoeRun(x, weights, ids, experts, limit, cfg)()
