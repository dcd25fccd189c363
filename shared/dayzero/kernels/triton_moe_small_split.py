"""Split-K fused MoE for decode-sized batches: two to four launches ([plan], gate_up, down, [combine]).

``MoeSplit`` allocates the buffers of one call and launches the kernels of
``triton_moe_small_split_kernels`` (read its docstring for the algorithm): bf16 activations, FP8
experts with 128x128 block scales, expert parallel through ``experts.derived["expert_offset"]``,
static shapes for a given T and no host syncs (CUDA-graph capturable), bitwise repeatable
(partials are summed in a fixed order). At T * k <= ``fuse_max_pairs`` two launches: gate_up and
down (which also combines); above, plan + gate_up + down + combine. At T = 1 (up to ``gemv_max_t``
tokens for gate_up) tiles with ``gemv`` launch the CUDA-core GEMV kernels of ``triton_moe_small_gemv``
instead (still two launches); tiles with ``pdl`` launch down with programmatic dependent launch
(``triton_moe_small_pdl``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton

from .triton_moe_gemm import interpreting
from .triton_moe_small_gemv import gemv_down_kernel, gemv_gate_up_kernel
from .triton_moe_small_route import plan_kernel
from .triton_moe_small_split_kernels import combine_kernel, down_kernel, gate_up_kernel
from .triton_moe_small_wg import WG_VARIANTS
from .triton_moe_small_wg import launch_down as wg_down
from .triton_moe_small_wg import launch_gate_up as wg_gate_up
from .triton_moe_small_wgs import launch_down as wgs_down
from .triton_moe_small_wgs import launch_gate_up as wgs_gate_up
from .types import ExpertWeights

SWIGLU_ALPHA = 1.702
# Where the registered triton op (``triton_moe.moe_experts``) takes this path instead of the aligned
# one, from GPU run 5 (bench/results/moe-small-run5-20261130.json, CUDA graphs, top-4, default tiles):
# every T * k <= 256 (T <= 64) except 8 < T * k <= 16 with < 64 local experts (20B T = 4: 122.5 vs
# 119.5 us); e.g. 20B T = 1 59.3 vs 68.2 us, T = 64 266.6 vs 289.0; 120B T = 1 59.2 vs 71.2, T = 64
# 848.2 vs 912.8 (bench/NOTES.md "MoE decode run 5"). Run 8: 20B T = 4 on the best split tiles
# (gv64_d32) 119.5 vs aligned 120.5 us, a tie: the exception stays.
DECODE_MAX_PAIRS = 256
BK = 128  # one weight scale block per K step


@dataclass(frozen=True)
class SplitTiles:
    """Launch configuration. ``split_*``: K splits per (slot, N tile); 0 = enough programs for
    ``target_programs`` when every slot is touched (a slot is a distinct local expert, at most
    min(T * k, E))."""

    bm: int = 16
    bn_gate_up: int = 32
    bn_down: int = 32
    h16: bool = True             # h in fp16 (down multiplies in fp16: fewer conversion instructions)
    # gate_up's MMA tiles: x rows through power-of-two scales into fp16, the weights widened to fp16 (one F2FP per
    # two) instead of bf16 (two quarter-rate F2F more each, which bound the step: bench/NOTES.md session 7); opt-in
    x16: bool = False
    split_gate_up: int = 0
    split_down: int = 0
    target_programs: int = 1584  # 12 per SM on an H200 (132 SMs)
    max_split: int = 8
    warps: int = 4
    warps_down: int = 0          # 0: same as ``warps``
    stages: int = 4
    # up to this many pairs (T * k) slots are pairs (leader scan in-kernel, no plan launch) and down
    # does the combine itself (tickets); above it the plan launch and the combine launch run
    fuse_max_pairs: int = 32
    # T = 1 only: CUDA-core GEMV kernels (``triton_moe_small_gemv``) with N tiles bn_gate_up / bn_down,
    # K steps of gemv_bk (divides 128), gemv_u steps issued back to back
    gemv: bool = False
    gemv_down: bool = True       # with ``gemv``: down on the GEMV kernel too (else the MMA down of bn_down)
    gemv_bk: int = 128
    gemv_u: int = 2
    # GEMV K loop (``triton_moe_small_gemv._row_dot``): gemv_pipe > 0 software-pipelines it over that many
    # stages (cp.async into shared memory: gemv_pipe - 1 trips in flight instead of the U steps of one trip);
    # gemv_group > 0 sums groups of that many products before scaling (fewer registers and instructions)
    gemv_pipe: int = 0
    gemv_group: int = 0
    gemv_max_t: int = 1          # gate_up on the GEMV kernel up to this many tokens (one program per pair)
    stages_down: int = 0         # pipeline depth of the MMA down kernel (0: ``stages``)
    # fused calls (``triton_moe_small_pdl``): the down grid launched with programmatic dependent launch
    # (gate_up lets it start at once; down waits for gate_up before reading h or storing)
    pdl: bool = False
    # MMA kernels: each program loads its K range's block scales once before the K loop (``_stream``
    # SK > 0) instead of one step ahead (a global load whose register move waits inside every step)
    row_scales: bool = False
    # fused down (MMA): the last program of an N tile loads each token's ids and y rows at once
    # (``_combine_rows``) instead of an ids load then a y load per route
    vec_combine: bool = False
    # fused MMA kernels: the pair ids loaded once per program for its slot, rows (and down's touched count)
    # (``triton_moe_small_route._slot_of`` ...) instead of dependent reloads before the first weight load
    ids_once: bool = False
    # T <= gemv_max_t: both stages on the FP8 tensor-core "swap AB" kernels (``triton_moe_small_wg``; weights
    # via shared memory into an e4m3 dot, the token quantized per 128 in-kernel: 1 = one e4m3 term, 2 = hi +
    # lo), wg_stages pipeline stages, down split over wg_split_down K ranges (N tiles bn_gate_up / bn_down)
    wg: int = 0
    wg_stages: int = 4
    wg_split_down: int = 1
    wg_hq: bool = False          # gate_up writes h as e4m3 hi + lo rows (fixed scale): down loads them as its B
    wg_tma: bool = False         # the weight tiles through TMA (host descriptors) instead of per-thread cp.async
    # wg kernels with one program per expert slot carrying all its tokens (<= 8) as B columns
    # (``triton_moe_small_wgs``: each weight tile read once per call; needs wg = 2 and wg_hq)
    wg_slots: bool = False


# Candidate launch configurations (the GPU tests check each; the bench times each at every T).
# Run 3: every variant within ~10 % of the others at T = 1: the K loop is bound by instructions per
# weight byte. Run 4 (fp16 down, unmasked full K blocks; sm_90 compile, instructions per K step and KB
# of weights per warp, `bench/moe/compile_check_small.py`): gate_up bn64 146, bn128 122; down bn64 94,
# bn128 86 (run 3: 209 at bn32). Dropped after run 4 (slower at every T): bn32, 2-warp and 8-warp
# tiles, twice the K splits, bf16 h, unfused at T = 1. Run 5 (A rows masked again): bn64 fastest from
# T = 2 on, g64_d128 at T = 1, bn128 nowhere.
# Session 4 (runs 6-7): at T = 1 neither one prologue per program (a persistent grid over the flattened
# work list, since removed: commit 891ffc9) nor 5-6 programs per SM (register caps) moved gate_up; an
# unsplit gate_up of narrow tiles did (k1: 720 programs of 32 rows x the whole K, no partials or
# tickets in gate_up): 39.0 -> 32.1 us.
_R = dict(row_scales=True, vec_combine=True, ids_once=True)   # the run-10 options (``_r`` variants)
VARIANTS = {
    "bn64": SplitTiles(bn_gate_up=64, bn_down=64),
    "bn128": SplitTiles(bn_gate_up=128, bn_down=128),
    "g64_d128": SplitTiles(bn_gate_up=64, bn_down=128),
    "k1": SplitTiles(bn_gate_up=32, bn_down=128, split_gate_up=1),
    # down unsplit too (run 8: d64 the default at T = 2, 76.1 vs k1 85.3 us; d32 / d64 down 18.9-19.6 vs
    # 20.6 us at T = 1), and narrower gate_up tiles (k1_g16: 50 vs 33 us at T = 1, slower everywhere)
    "k1_d32": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1),
    "k1_d64": SplitTiles(bn_gate_up=32, bn_down=64, split_gate_up=1, split_down=1),
    "k1_g16": SplitTiles(bn_gate_up=16, bn_down=128, split_gate_up=1),
    # session 5 (sm_90 builds of the T = 1 launch, before run 8): k1's gate_up (64 registers, 8 per SM)
    # already runs its 720 programs in one wave; its down (bn128 split 8, 142 registers, 3 per SM) runs
    # 736 programs in 1.86 waves. Down unsplit: d32 360 programs (72 registers, 7 per SM), d16 720 (61,
    # 8 per SM), all resident; g16w2: gate_up 16 wide on 2 warps (68 registers, 11 per SM: 1440 programs
    # in one wave, 1452 slots). Run 8: d16 down slower (27.3 us at T = 1), g16w2 ~ k1_d32
    "k1_d16": SplitTiles(bn_gate_up=32, bn_down=16, split_gate_up=1, split_down=1),
    "k1_g16w2_d32": SplitTiles(bn_gate_up=16, bn_down=32, split_gate_up=1, split_down=1, warps=2, warps_down=4),
    # T = 1 on CUDA cores (``triton_moe_small_gemv``): no 16-row MMA tile for one row. sm_90 builds (U = 2
    # steps in flight): gate_up bn32 80 registers (6 per SM: 720 programs in one wave), 154 instructions
    # per warp and KB of weights (k1's MMA loop 187); bn64 127 (4 per SM, 360 programs), 121; down bn16
    # 56 registers, 221 per KB, bn32 80, 155 (k1's bn128 MMA 89). Above T = 1 they run MMA tiles
    # (gv_d16 = k1_d16, gv_d32 = k1_d32, gv64_d32 = gate_up bn64 unsplit + down bn32 unsplit).
    # Run 8 at T = 1 (20B): GEMV gate_up 25.6 us vs k1's 32.8 (issue-bound: -22 % time for -18 %
    # instructions), GEMV down 21.2 (bn16) / 22.4 (bn32) vs MMA 18.9 (d32)
    "gv_d16": SplitTiles(bn_gate_up=32, bn_down=16, split_gate_up=1, split_down=1, gemv=True),
    "gv_d32": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1, gemv=True),
    "gv64_d32": SplitTiles(bn_gate_up=64, bn_down=32, split_gate_up=1, split_down=1, gemv=True),
    # candidates for run 9: GEMV gate_up + MMA down unsplit bn32 at T = 1, the best stage of each in run 8
    # (25.6 + 18.9 us vs gv_d16's 25.6 + 21.2). Every run-8 down lands at 19-22 us for 33 MB whatever its
    # shape, its read floor 11-13: by Little's law (~2 us loaded latency) a program keeps too few bytes in
    # flight: d32 at 4 stages has 3 x 4 KB per program, 2.7 programs per SM = 33 KB per SM; 8 stages:
    # 7 x 4 KB, 3 per SM (58 KB shared memory each, 360 programs in 396 slots) = 76 KB per SM. d64 at 6
    # stages: 5 x 8 KB, 3 per SM (T = 2: 360 programs)
    "gvg_d32": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1, gemv=True, gemv_down=False),
    "gvg_d32_s8": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1, gemv=True, gemv_down=False,
                             stages_down=8),
    "k1_d32_s8": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1, stages_down=8),
    "k1_d64_s6": SplitTiles(bn_gate_up=32, bn_down=64, split_gate_up=1, split_down=1, stages_down=6),
    # run 10 (bench/NOTES.md "MoE decode run 10", timed in run 11): ``_r`` = each program's block scales loaded
    # once (row_scales), the fused combine's loads at once (vec_combine), the pair ids loaded once (ids_once).
    # Run 11 call 1: T = 1 down 19.1 -> 18.4 us only; T = 2-8 -3 to -5 %. The 8 / 6-stage and scale-rows-alone
    # variants (gvg_d32_r8, k1_d64_r6, gvg_d32_rs) were no better and are removed.
    "gvg_d32_r": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1, gemv=True, gemv_down=False,
                            row_scales=True, vec_combine=True, ids_once=True),
    "k1_d64_r": SplitTiles(bn_gate_up=32, bn_down=64, split_gate_up=1, split_down=1, row_scales=True,
                           vec_combine=True, ids_once=True),
    "gv64_d32_r": SplitTiles(bn_gate_up=64, bn_down=32, split_gate_up=1, split_down=1, gemv=True, row_scales=True,
                             vec_combine=True, ids_once=True),
    "bn64_r": SplitTiles(bn_gate_up=64, bn_down=64, row_scales=True, vec_combine=True, ids_once=True),
    # run 11 (bench/NOTES.md "MoE decode run 11"): the GEMV gate_up with in-thread groups of 16 products
    # (gemv_group: 140 vs 154 instructions per warp and KB, 63 registers) 25.4 -> 22.8 us at T = 1. Lost and
    # removed: the cp.async-pipelined GEMV (gemv_pipe, 24.3 us; down 25.0), bn64 / U = 4 GEMV tiles, L2 bulk
    # prefetches of the weights (30-100 % slower), PDL at T = 1 (40.5 -> 49.1 us)
    "gvq_d32": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1, gemv=True, gemv_down=False,
                          gemv_group=16),
    "gvq_d32_r": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1, gemv=True, gemv_down=False,
                            gemv_group=16, row_scales=True, vec_combine=True, ids_once=True),
    # the grouped GEMV gate_up also at T > 1 (gemv_max_t: one program per (N tile, pair)) with PDL between the
    # kernels (``_rp``): run 11 call 2, T = 2 gvq2_d64_rp 70.9 / 72.2 us vs k1_d64 76.0 / 78.5; T = 4
    # gvqt8_d32_rp 105.5 / 122.1 vs the aligned path 119.1 (20B) / gv64_d32 149.0 (120B). The same without PDL
    # (``_r``; PDL cost 8.6 us at T = 1) and gvqt8 at T = 5-8 are not timed yet
    "gvq2_d64_rp": SplitTiles(bn_gate_up=32, bn_down=64, split_gate_up=1, split_down=1, gemv=True, gemv_down=False,
                              gemv_group=16, gemv_max_t=2, row_scales=True, vec_combine=True, ids_once=True,
                              pdl=True),
    "gvqt8_d32_rp": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1, gemv=True,
                               gemv_down=False, gemv_group=16, gemv_max_t=8, row_scales=True, vec_combine=True,
                               ids_once=True, pdl=True),
    "gvq2_d64_r": SplitTiles(bn_gate_up=32, bn_down=64, split_gate_up=1, split_down=1, gemv=True, gemv_down=False,
                             gemv_group=16, gemv_max_t=2, row_scales=True, vec_combine=True, ids_once=True),
    "gvqt8_d32_r": SplitTiles(bn_gate_up=32, bn_down=32, split_gate_up=1, split_down=1, gemv=True,
                              gemv_down=False, gemv_group=16, gemv_max_t=8, row_scales=True, vec_combine=True,
                              ids_once=True),
}
# session 6, CPU only (bench/NOTES.md "MoE decode run 12"; not timed): the FP8 tensor-core kernels at T = 1-2
VARIANTS.update({name: SplitTiles(**kw, **_R) for name, kw in WG_VARIANTS.items()})
# session 7, CPU only (bench/NOTES.md "MoE decode: x16"): MMA tiles with gate_up's products in fp16 (``x16``): the
# shipped ones of T > 4 and k1_d64_r (T = 2-4 beside the GEMV gate_up defaults)
VARIANTS.update({f"{name}_x16": replace(VARIANTS[name], x16=True)
                 for name in ("bn64_r", "bn64", "g64_d128", "k1_d64_r")})
# the device tests run the engine on candidates before they become defaults: this environment variable
# holds "name[@max_pairs],..." (``VARIANTS`` names); the first entry whose max_pairs >= T * k (or with
# none) replaces the default tiles, pair counts past every entry keep the default
TILES_ENV = "DAYZERO_MOE_SMALL_TILES"


def forced_tiles(pairs: int) -> SplitTiles | None:
    """The tiles ``DAYZERO_MOE_SMALL_TILES`` names for ``pairs``, or None."""
    for entry in filter(None, os.environ.get(TILES_ENV, "").split(",")):
        name, _, most = entry.partition("@")
        if name not in VARIANTS or (most and not most.isdigit()):
            raise ValueError(f"{TILES_ENV}: {entry!r} is not NAME[@MAX_PAIRS] with NAME in {sorted(VARIANTS)}")
        if not most or pairs <= int(most):
            return VARIANTS[name]
    return None


def takes_split(pairs: int, E: int) -> bool:
    """Whether a call with ``pairs`` = T * k (token, expert) pairs and E local experts runs here: every
    T * k <= 256 except 8 < T * k <= 16 with < 64 local experts unless the tiles there load their block
    scales once (``row_scales``; run 11, 20B T = 4 vs the aligned path 119.1 us: gvqt8_d32_rp 105.5 (call 2),
    gv64_d32_r 113.1 (call 1); without row_scales: gv64_d32 118.6, run 8 119.5 vs 120.5, a tie)."""
    if not 0 < pairs <= DECODE_MAX_PAIRS:
        return False
    return not (E < 64 and 8 < pairs <= 16) or default_tiles(pairs, E).row_scales


def default_tiles(pairs: int, E: int) -> SplitTiles:
    """Session 8's calls (bench/NOTES.md "Session 8", same-run anchors, CUDA graphs, 20B / 120B us; each pick
    > 2 % faster at both E than the tile it replaced (``bench/moe/pick_small.py``), its GPU tests, the
    registered-op / graph-replay tests and the engine's CUDA-graph tests passed under it): wg_d64_s2_qt at
    T * k <= 4 (T = 1: 34.5 / 34.8 vs gvq_d32_r 40.2 / 40.6), wg2_d64_s2_qtp at <= 8 (T = 2: 60.9 / 62.6 vs
    gvq2_d64_r 65.6 / 66.9), wg8_d64_qtp at <= 16 (T = 4: 96.0 / 111.9 vs gvqt8_d32_rp 103.2 / 118.8),
    bn64_x16 above 32 (T = 16: 212.1 / 331.7 vs bn64 233.7 / 371.5). Session 9 (``candidates.sh moe``):
    wgs8_d64_qt at <= 32 (the slot kernels: one program per expert, its <= 8 tokens as wgmma B columns; T = 8:
    158.4 / 203.6 vs bn64_r_x16 175.3 / 225.7; session 8's bn64_r_x16 had replaced bn64_r there). Session 10
    (call 5): the shallower rings, wg2_d64_s2_qtp_st3 at <= 8 (T = 2: 58.5 / 60.8 vs 61.8 / 63.9) and, with fewer
    than 64 local experts, wg8_d64_qtp_st2 at <= 16 (20B T = 4: 90.5 vs 95.8; at 120B 112.7 vs 114.6, under the
    2 % margin: wg8_d64_qtp stays there).
    ``DAYZERO_MOE_SMALL_TILES`` overrides it (``forced_tiles``: device tests of candidates)."""
    forced = forced_tiles(pairs)
    if forced is not None:
        return forced
    t4 = "wg8_d64_qtp_st2" if E < 64 else "wg8_d64_qtp"
    return VARIANTS["wg_d64_s2_qt" if pairs <= 4 else "wg2_d64_s2_qtp_st3" if pairs <= 8 else t4 if pairs <= 16
                    else "wgs8_d64_qt" if pairs <= 32 else "bn64_x16"]


def choose_split(requested: int, slots: int, n_tiles: int, K: int, tiles: SplitTiles) -> int:
    """K splits: the requested count, or the fewest that give ``target_programs`` (at most
    ``max_split`` and the number of K blocks)."""
    most = max(1, min(tiles.max_split, triton.cdiv(K, BK)))
    if requested:
        return max(1, min(requested, most))
    return max(1, min(triton.cdiv(tiles.target_programs, max(1, slots * n_tiles)), most))


def scale_row(K: int, split: int, tiles: SplitTiles) -> int:
    """``_stream``'s SK: 0 (scales one step ahead) or the power of two holding a program's K blocks."""
    return triton.next_power_of_2(triton.cdiv(triton.cdiv(K, BK), split)) if tiles.row_scales else 0


def _tickets(experts: ExpertWeights, n: int, dev: torch.device) -> torch.Tensor:
    """Ticket counters kept with the weights (zero between calls: each is reset by its last user),
    so a call needs no memset; calls on the same experts must not run concurrently."""
    key = f"moe_split_tickets_{n}"
    buf = experts.derived.get(key)
    if buf is None:
        buf = experts.derived[key] = torch.zeros((n,), dtype=torch.int32, device=dev)
    return buf


class MoeSplit:
    """One decode MoE call: buffers allocated here, stages re-runnable on them (``STAGES``);
    ``__call__`` runs them in order and returns out [T, H]."""

    def __init__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                 limit: float, tiles: SplitTiles | None = None) -> None:
        T, H, E, I = experts.check_call(x, weights, ids)
        if experts.gate_up_scale is None or experts.down_scale is None:
            raise ValueError("the split-K MoE path needs fp8 experts with gate_up_scale and down_scale")
        if x.dtype != torch.bfloat16:
            raise ValueError(f"the split-K MoE path takes bf16 activations, got {x.dtype}")
        self.tiles = t = tiles or default_tiles(T * ids.shape[1], E)
        self.trace: tuple | None = None   # (gate_up, down) int64 [programs, 4]: wg kernels' TRACE (diagnostic)
        for bn in (t.bn_gate_up, t.bn_down):
            if bn < 16 or 128 % bn:
                raise ValueError(f"N tile {bn} must divide 128 and be >= 16")
        if t.gemv and (128 % t.gemv_bk or t.gemv_u < 1 or (t.gemv_group and t.gemv_bk % t.gemv_group)):
            raise ValueError(f"gemv_bk {t.gemv_bk} must divide 128, gemv_u {t.gemv_u} be >= 1 and gemv_group "
                             f"{t.gemv_group} divide gemv_bk")
        if t.bm < 16:
            raise ValueError(f"bm must be >= 16, got {t.bm}")
        self.T, self.H, self.I, self.E, self.k = T, H, I, E, ids.shape[1]
        self.x, self.ids, self.weights, self.ex, self.limit = (x.contiguous(), ids.contiguous(),
                                                               weights.contiguous(), experts, float(limit))
        self.offset = int(experts.derived.get("expert_offset", 0))
        self.P, dev = T * self.k, x.device
        self.nt1, self.nt2 = triton.cdiv(2 * I, t.bn_gate_up), triton.cdiv(H, t.bn_down)
        self.tb = max(64, triton.next_power_of_2(T))
        self.fused = self.P <= t.fuse_max_pairs
        self.wg = t.wg > 0 and T <= t.gemv_max_t and self.fused   # both stages on triton_moe_small_wg
        self.gemv = t.gemv and T <= t.gemv_max_t and self.fused and not self.wg   # gate_up on CUDA-core GEMV
        self.gemv_down = self.gemv and t.gemv_down and T == 1    # one row per route
        self.slots = self.P if self.fused else min(self.P, E)   # slot = pair (leader scan) or plan table row
        self.pb = max(16, triton.next_power_of_2(self.slots))
        self.slot_e = torch.empty((self.slots,), dtype=torch.int32, device=dev)
        self.slot_cnt = torch.empty((self.slots,), dtype=torch.int32, device=dev)
        self.slot_pairs = torch.empty((self.slots, self.tb), dtype=torch.int32, device=dev)
        touched = min(self.P, E)  # slots that can be valid (split counts assume all of them are)
        self.s1 = 1 if self.gemv or self.wg else choose_split(t.split_gate_up, touched, self.nt1, H, t)
        self.s2 = max(1, t.wg_split_down) if self.wg else 1 if self.gemv_down else \
            choose_split(t.split_down, touched, self.nt2, I, t)
        n1 = self.slots * self.nt1
        tickets = _tickets(experts, n1 + self.nt2, dev)
        self.tickets1, self.tickets2 = tickets[:n1], tickets[n1:]
        self.ws = torch.empty((self.s1, self.P, 2 * I) if self.s1 > 1 else (1,), dtype=torch.float32, device=dev)
        self.h = torch.empty((self.P, I), dtype=torch.float16 if t.h16 else torch.bfloat16, device=dev)  # per pair
        self.y = torch.empty((self.s2, self.P, H), dtype=torch.float32, device=dev)       # per split, pair
        self.out = torch.empty((T, H), dtype=x.dtype, device=dev)
        self.pdl = t.pdl and self.fused and not interpreting()   # (the interpreter runs no inline asm)
        self.launch = dict(TOPK=self.k, BM=t.bm, BK_=BK, H16=t.h16, TB=self.tb, PB=self.pb, PLAN=not self.fused,
                           ONE_CHUNK=T <= t.bm, DOT_F32=interpreting(), num_stages=t.stages)

    def plan(self) -> None:
        if self.fused:
            return
        plan_kernel[(self.slots,)](self.ids, self.slot_e, self.slot_cnt, self.slot_pairs, self.T,
                                   self.offset, self.E, TOPK=self.k, TB=self.tb,
                                   KP=triton.next_power_of_2(self.k), EB=triton.next_power_of_2(self.E + 1),
                                   num_warps=4)

    def _gemv_args(self, K: int) -> dict:
        t = self.tiles
        return dict(BK=t.gemv_bk, U=t.gemv_u, EVEN_K=K % (t.gemv_bk * t.gemv_u) == 0, PIPE=t.gemv_pipe,
                    G=t.gemv_group)

    def _pdl_launch(self) -> dict:
        return dict(launch_pdl=True) if self.pdl else {}

    def gate_up(self) -> None:
        ex, t = self.ex, self.tiles
        w, s, b = ex.gate_up, ex.gate_up_scale, ex.gate_up_bias
        if self.wg:
            return (wgs_gate_up if t.wg_slots else wg_gate_up)(self, SWIGLU_ALPHA, interpreting())
        if self.gemv:
            gemv_gate_up_kernel[(self.P * self.nt1,)](
                self.x, self.ids, w, s, b, self.h, self.H, 2 * self.I, self.nt1, self.offset, self.E, w.stride(0),
                w.stride(1), s.stride(0), s.stride(1), b.stride(0), self.h.stride(0), self.limit, SWIGLU_ALPHA,
                BN=t.bn_gate_up, PDL=self.pdl, num_warps=t.warps,
                P=self.P if self.T > 1 else 0, TOPK=self.k, stride_x=self.x.stride(0), **self._gemv_args(self.H))
            return
        gate_up_kernel[(self.slots * self.nt1 * self.s1,)](
            self.x, self.ids, w, s, b, self.h, self.ws, self.tickets1, self.slot_e, self.slot_cnt, self.slot_pairs,
            self.H, 2 * self.I, self.nt1, self.P, self.offset, self.E, self.x.stride(0), w.stride(0), w.stride(1),
            s.stride(0), s.stride(1), b.stride(0), self.h.stride(0), self.limit, SWIGLU_ALPHA, BN=t.bn_gate_up,
            SPLIT=self.s1, EVEN_N=(2 * self.I) % t.bn_gate_up == 0, SK=scale_row(self.H, self.s1, t),
            IDS1=t.ids_once and self.fused, PDL=self.pdl, X16=t.x16, num_warps=t.warps, **self.launch)

    def down(self) -> None:
        ex, t = self.ex, self.tiles
        w, s, b = ex.down, ex.down_scale, ex.down_bias
        if self.wg:
            return (wgs_down if t.wg_slots else wg_down)(self, interpreting())
        if self.gemv_down:
            gemv_down_kernel[(self.k * self.nt2,)](
                self.h, self.ids, self.weights, w, s, b, self.y, self.out, self.tickets2, self.I, self.H, self.nt2,
                self.P, self.offset, self.E, self.h.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1),
                b.stride(0), self.out.stride(0), TOPK=self.k, PB=self.pb, BN=t.bn_down,
                DOT_F32=interpreting(), PDL=self.pdl,
                num_warps=t.warps_down or t.warps, **self._pdl_launch(), **self._gemv_args(self.I))
            return
        down_kernel[(self.slots * self.nt2 * self.s2,)](
            self.h, self.ids, self.weights, w, s, b, self.y, self.out, self.tickets2, self.slot_e, self.slot_cnt,
            self.slot_pairs, self.T, self.I, self.H, self.nt2, self.P, self.offset, self.E, self.slots,
            self.h.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), b.stride(0), self.out.stride(0),
            FUSE=self.fused, BN=t.bn_down, SPLIT=self.s2, EVEN_N=self.H % t.bn_down == 0,
            SK=scale_row(self.I, self.s2, t), KP=triton.next_power_of_2(self.k) if t.vec_combine else 0,
            IDS1=t.ids_once and self.fused, PDL=self.pdl,
            num_warps=t.warps_down or t.warps, **self._pdl_launch(), **dict(self.launch, num_stages=t.stages_down or t.stages))

    def combine(self) -> None:
        if self.fused:
            return
        bh = 1024
        combine_kernel[(self.T, triton.cdiv(self.H, bh))](
            self.y, self.ids, self.out, self.H, self.P, self.offset, self.E, self.out.stride(0),
            TOPK=self.k, SPLIT=self.s2, BH=bh, num_warps=4)

    STAGES = ("plan", "gate_up", "down", "combine")

    def __call__(self) -> torch.Tensor:
        if self.T:
            for name in self.STAGES:
                getattr(self, name)()
        return self.out


def moe_split(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
              limit: float, tiles: SplitTiles | None = None) -> torch.Tensor:
    """x [T, H] bf16, weights/ids [T, k], fp8 experts -> [T, H] in x.dtype (decode-sized T)."""
    return MoeSplit(x, weights, ids, experts, limit, tiles)()
