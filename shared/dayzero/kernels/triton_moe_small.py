"""Fused MoE for decode-sized batches (T * top-k <= 256 pairs): two to four launches, no alignment pass.

``MoeSmall`` allocates the buffers of one call and launches the kernels of
``triton_moe_small_kernels`` (read its docstring for the algorithm): optionally ``plan`` (routing
tables, one program per expert slot), ``gate_up`` (h [P, I] bf16), ``down`` (y [P, H] fp32, or the
combined output with ``fused_combine``) and ``combine``. Activations stay bf16 (weight-only FP8,
block scales applied per 128-wide K step); expert parallel through ``experts.derived["expert_offset"]``;
static shapes for a given T and no host syncs, so the call can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .triton_moe_small_kernels import combine_kernel, down_kernel, gate_up_kernel, plan_kernel
from .types import ExpertWeights

SWIGLU_ALPHA = 1.702
# T * k up to which the registered triton op takes this path (4 = T = 1 at top-4). Runs 1-2 (CUDA
# graphs): 3-4 % faster than the aligned path at T = 1, slower from T = 2 on (bench/NOTES.md "MoE
# decode"). Off (0) until the kernels as refactored after run 2 have run on a GPU.
DECODE_MAX_PAIRS = 0
BK = 128                # one weight scale block per K step


@dataclass(frozen=True)
class SmallTiles:
    """Launch configuration: M rows per dot, N columns per program (each divides 128), warps, stages,
    and whether down does the combine itself (two launches) or a third launch does (run 1: the
    separate combine was 3-5 % faster than the arrival counters at every T)."""

    bm: int = 16
    bn_gate_up: int = 32
    bn_down: int = 32
    warps: int = 4
    stages: int = 4
    fused_combine: bool = False
    # Register cap per thread (0: the compiler's choice). Compiled for sm_90 on the CPU: gate_up 136 and
    # down 188 registers -> 3 and 2 programs per SM (the same loop alone: 64); 128 -> 4 per SM. Not yet timed.
    maxnreg: int = 0
    # Routing tables (expert, count, pair ids per slot) from one small launch instead of every GEMM
    # program working them out: the GEMM programs lose the prologue that sets their register count.
    plan: bool = False


def default_tiles(T: int) -> SmallTiles:
    return SmallTiles()  # run 1: bm 16 beat bm 32 at T = 64 (428 vs 800 us); N tiles re-measured in run 2


def interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kblocks(K: int) -> int:
    return triton.next_power_of_2(triton.cdiv(K, BK))


class MoeSmall:
    """One decode MoE call: buffers allocated here, ``gate_up``, ``down`` (and ``combine`` without the
    fused combine) re-runnable on them; ``__call__`` runs them in order and returns out [T, H]."""

    def __init__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                 limit: float, tiles: SmallTiles | None = None) -> None:
        T, H, E, I = experts.check_call(x, weights, ids)
        if experts.gate_up_scale is None or experts.down_scale is None:
            raise ValueError("the small-T MoE path needs fp8 experts with gate_up_scale and down_scale")
        if x.dtype != torch.bfloat16:
            raise ValueError(f"the small-T MoE path takes bf16 activations, got {x.dtype}")
        self.tiles = t = tiles or default_tiles(T)
        for bn in (t.bn_gate_up, t.bn_down):
            if bn < 16 or 128 % bn:
                raise ValueError(f"N tile {bn} must divide 128 and be >= 16")
        self.T, self.H, self.I, self.E, self.k = T, H, I, E, ids.shape[1]
        self.x, self.ids, self.weights, self.ex, self.limit = (x.contiguous(), ids.contiguous(),
                                                               weights.contiguous(), experts, float(limit))
        self.offset = int(experts.derived.get("expert_offset", 0))
        P, dev = T * self.k, x.device
        self.slots = min(P, E)
        self.nt1, self.nt2 = triton.cdiv(2 * I, t.bn_gate_up), triton.cdiv(H, t.bn_down)
        self.const = dict(TOPK=self.k, TB=max(64, triton.next_power_of_2(T)), KP=triton.next_power_of_2(self.k),
                          EB=triton.next_power_of_2(E + 1), BM=t.bm, BK_=BK, DOT_F32=interpreting())
        self.launch = dict(maxnreg=t.maxnreg) if t.maxnreg else {}
        self.const["PLAN"] = t.plan
        tb = self.const["TB"]
        self.tables = (torch.empty((self.slots,), dtype=torch.int32, device=dev),        # expert per slot
                       torch.empty((self.slots,), dtype=torch.int32, device=dev),        # tokens per slot
                       torch.empty((self.slots, tb), dtype=torch.int32, device=dev)) \
            if t.plan else (self.x, self.x, self.x)                                        # unused
        self.h = torch.empty((P, I), dtype=torch.bfloat16, device=dev)     # per pair
        self.y = torch.empty((P, H), dtype=torch.float32, device=dev)      # per pair, weighted
        self.cnt = torch.empty((T * self.nt2 if t.fused_combine else 1,), dtype=torch.int32, device=dev)
        self.out = torch.empty((T, H), dtype=x.dtype, device=dev)

    def plan(self) -> None:
        if self.tiles.plan:
            c = self.const
            plan_kernel[(self.slots,)](self.ids, *self.tables, self.T, self.offset, self.E, TOPK=c["TOPK"],
                                        TB=c["TB"], KP=c["KP"], EB=c["EB"], num_warps=4)

    def gate_up(self) -> None:
        ex, t = self.ex, self.tiles
        w, s, b = ex.gate_up, ex.gate_up_scale, ex.gate_up_bias
        gate_up_kernel[(self.slots * self.nt1,)](
            self.x, self.ids, w, s, b, self.h, self.cnt, *self.tables,
            self.T, self.H, 2 * self.I, self.E, self.offset, self.nt1, self.cnt.numel() if t.fused_combine else 0,
            self.x.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), b.stride(0), self.h.stride(0),
            self.limit, SWIGLU_ALPHA, BN=t.bn_gate_up, KBP=_kblocks(self.H), num_warps=t.warps, num_stages=t.stages,
            **self.const, **self.launch)

    def down(self) -> None:
        ex, t = self.ex, self.tiles
        w, s, b = ex.down, ex.down_scale, ex.down_bias
        down_kernel[(self.slots * self.nt2,)](
            self.h, self.ids, self.weights, w, s, b, self.y, self.out, self.cnt, *self.tables,
            self.T, self.I, self.H, self.E, self.offset, self.nt2,
            self.h.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), b.stride(0), self.y.stride(0),
            self.out.stride(0), BN=t.bn_down, KBP=_kblocks(self.I), FUSED=t.fused_combine, num_warps=t.warps,
            num_stages=t.stages, **self.const, **self.launch)

    def combine(self) -> None:
        if self.tiles.fused_combine:
            return
        bh = 1024
        combine_kernel[(self.T, triton.cdiv(self.H, bh))](
            self.y, self.ids, self.out, self.H, self.offset, self.E, self.y.stride(0), self.out.stride(0),
            TOPK=self.k, BH=bh, num_warps=4)

    STAGES = ("plan", "gate_up", "down", "combine")

    def __call__(self) -> torch.Tensor:
        if self.T:
            self.plan()
            self.gate_up()
            self.down()
            self.combine()
        return self.out


def moe_small(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
              limit: float, tiles: SmallTiles | None = None) -> torch.Tensor:
    """x [T, H] bf16, weights/ids [T, k], fp8 experts -> [T, H] in x.dtype (decode-sized T)."""
    return MoeSmall(x, weights, ids, experts, limit, tiles)()
