"""FA3-style causal prefill attention with sinks in Gluon (Hopper, sm_90): ping-pong consumer warpgroups.

The registered attention op runs it (config ``pp3_nopin``) where it applies, and the Triton kernel
everywhere else: ``triton_attention_prefill.gluon_prefill_choice`` (DAYZERO_PREFILL_GLUON=0 turns it off).
First run on an H200 in session 5 (bench/NOTES.md "Gluon prefill on the GPU"): every configuration
passes its tests; pp3_nopin is 8 / 17 / 14 % faster than the Triton kernel at 8k / 32k / 128k tokens, the
two-warpgroup ones are level with it. Supported case: full causal (no window), head dim 64, bf16 q/k/v,
any GQA group, and NO cached prefix: the keys are the new k/v of the call (``cached_lens`` all zero),
read through TMA from the contiguous [T, H, D] tensors. ``prefill_attention`` checks this and raises
``ValueError`` otherwise.

Why (bench/NOTES.md, "The two numbers"): at head dim 64 the exp unit and the tensor core need about
the same time per score, so a program that runs QK^T, softmax, PV in turn leaves one of them idle. Here
one CTA holds NWG consumer warpgroups of 64 query rows each (one query head, BM = 64 * NWG consecutive
tokens) and one producer warp:
  * producer (1 warp): TMA loads Q (NWG boxes [64, 64]) once, then K_j and V_j ([BN, 64] boxes of the
    KV head) into a STAGES-deep ring, one ``ready`` / ``empty`` mbarrier pair per stage and tensor
    (``empty`` counts NWG arrivals: every consumer reads every tile);
  * consumer g, key tile j >= 1 (FA3's schedule): wait for K_j and V_{j-1}; wait for its *turn*; issue
    S = Q K_j^T and O += P_{j-1} V_{j-1} (async wgmma, P from registers); pass the turn on; wait for S
    only; release K_j; softmax of S (P_j, row max / sum, alpha); wait for O; release V_{j-1};
    O *= alpha. ptxas hoists the wait for O above the softmax (the PTX has it after; the SASS then has no
    exp under the PV wgmma), unless something the wait cannot pass depends on the softmax: ``pin`` stores
    the row sums to shared memory before that wait (2 STS a tile). The turn (mbarrier ``turn[g]``, passed
    round-robin g -> g + 1) lets one warpgroup's wgmmas run while the others do their softmax: the tensor
    core and the MUFU overlap across warpgroups, and inside a warpgroup the PV product overlaps its own
    softmax.
  * tile 0 is peeled (no PV yet), then the tiles every row of the CTA sees whole (no mask), then the
    tiles at the diagonal (masked, ``key <= query``); every consumer walks every tile of the CTA (turns
    stay in lock step), so a warpgroup may score a tile it sees nothing of (p = 0 exactly, as the
    running max is finite from tile 0, whose key 0 every row sees).
  * epilogue: the last PV, then the sink joins the softmax once (``l = l * 2^(m - m') + 2^(sink - m')``,
    ``m' = max(m, sink)``, as ``triton_attention_prefill``), O / l stored with rows past the sequence masked.
Rows of a tile past the sequence's end read the next sequence's q/k/v (finite) or TMA zero fill past T;
their outputs are never stored, and keys past the end are masked for every stored row (key <= query).

Configurations (``CONFIGS``): pp3_nopin (``DEFAULT``: 3 consumer warpgroups, 128-key tiles, 160
registers each, no pin, P carried as the bf16 A operand so that it builds without spills), pp2 (two
warpgroups, the session-4 design), pp2_persist (the same, persistent: one CTA per SM walks
the work items, ``gluon_attention_prefill_persistent``), pp2_nopin (ptxas's order), pp2_free (no turns),
pp2_s3 (3 K/V stages), pp3_n64 (3 warpgroups, 64-key tiles, 160 registers); pp3 (3 warpgroups, 128-key
tiles) spills in its sm_90 build and is not run. ``bench/attention/gluon_prefill_compile.py`` reports the
sm_90 builds; ``bench/attention/gluon_prefill_run.sh`` tests and times them in one device call.

``gluon_attention_schedule.emulate`` (pure torch, no triton) runs the same tile schedule, masks and sink
rule on the CPU; the tests check it against the torch reference, so the index logic is checked without a GPU;
``simulate_protocol`` there replays this kernel's mbarrier waits and arrives (keep the two in step).
Importing this module imports triton's Gluon.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gluon_attention_schedule import LOG2E, check_supported, tile_plan

HD = gl.constexpr(64)     # head dim
WM = gl.constexpr(64)     # query rows per consumer warpgroup


@dataclass(frozen=True)
class GluonPrefillConfig:
    """Launch configuration. Registers: the launch cap ``maxnreg`` x (4 * (NWG + 1)) warps is the budget
    setmaxnreg redistributes (65536 per SM, one CTA per SM): consumers + the producer's warpgroup."""

    nwg: int = 2               # consumer warpgroups (2: 128 query rows a CTA; 3: 192, FA3's hdim-64 tile)
    block_n: int = 128         # keys per tile
    stages: int = 2            # K/V ring depth (32 KB of shared memory per stage at BN 128)
    consumer_regs: int = 240
    producer_regs: int = 24
    maxnreg: int = 168
    pingpong: bool = True      # False (diagnostic): no turns, the warpgroups issue their wgmmas whenever ready
    pin: bool = True           # a shared-memory store of the row sums keeps the softmax before the PV wait
                               # (without it ptxas hoists that wait above the softmax: no overlap in a warpgroup)
    persistent: bool = False   # True: one CTA per SM walks the work items (gluon_attention_prefill_persistent)
    carry_a: bool = False      # P goes to the next tile as the bf16 A operand (fp32 P dead after the softmax)

    @property
    def block_m(self) -> int:
        return 64 * self.nwg


NWG3 = GluonPrefillConfig(nwg=3, consumer_regs=160, producer_regs=24, maxnreg=128)
CONFIGS = {"pp2": GluonPrefillConfig(), "pp2_nopin": GluonPrefillConfig(pin=False),
           "pp2_free": GluonPrefillConfig(pingpong=False),
           "pp2_s3": GluonPrefillConfig(stages=3), "pp2_persist": GluonPrefillConfig(persistent=True),
           "pp3_n64": GluonPrefillConfig(nwg=3, block_n=64, consumer_regs=160, producer_regs=24, maxnreg=128),
           "pp3": NWG3,
           "pp3_nopin": GluonPrefillConfig(nwg=3, consumer_regs=160, producer_regs=24, maxnreg=128, pin=False,
                                           carry_a=True),
           "pp2_persist_nopin": GluonPrefillConfig(persistent=True, pin=False)}
DEFAULT = CONFIGS["pp3_nopin"]
# what gluon_prefill_run.sh tests and times by default: the fastest three of session 5 (bench/NOTES.md)
RUN_CONFIGS = ("pp3_nopin", "pp2_nopin", "pp2_persist_nopin")


@gluon.jit
def _producer(p, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr,
              PIN: gl.constexpr, CARRY: gl.constexpr):
    """1 warp: Q once, then K_j / V_j for every key tile of the CTA into the ring."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pin_smem, q_bar, k_ready, k_empty, v_ready, v_empty, turn,
     o_ptr, sink_ptr, stride_ot, stride_oh, qk_scale, q_start, q_len, m_start, h, hkv, n_full, n_tiles) = p
    mbarrier.expect(q_bar, NWG * WM * HD * 2)
    for g in gl.static_range(NWG):
        tma.async_copy_global_to_shared(q_desc, [q_start + m_start + g * WM, h * HD], q_bar, q_smem.index(g))
    for j in range(n_tiles):
        s = j % STAGES
        ph = ((j // STAGES) & 1) ^ 1                        # the first pass finds every slot free
        row = q_start + j * BN
        mbarrier.wait(k_empty.index(s), ph)
        mbarrier.expect(k_ready.index(s), BN * HD * 2)
        tma.async_copy_global_to_shared(k_desc, [row, hkv * HD], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), ph)
        mbarrier.expect(v_ready.index(s), BN * HD * 2)
        tma.async_copy_global_to_shared(v_desc, [row, hkv * HD], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _softmax(sacc, m_i, l_i, qk_scale, j, rows, MASK: gl.constexpr, BN: gl.constexpr):
    """One tile's online softmax in base 2: sacc [WM, BN] raw scores -> p [WM, BN] fp32, alpha [WM],
    new running max / sum. MASK: key j * BN + c visible to query row r only if key <= r."""
    if MASK:
        cols = j * BN + gl.arange(0, BN, gl.SliceLayout(0, sacc.type.layout))
        vis = gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1)
        sc = gl.where(vis, sacc * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1))
        sc = sc - gl.expand_dims(m_new, 1)
    else:
        m_new = gl.maximum(m_i, gl.max(sacc, axis=1) * qk_scale)
        sc = sacc * qk_scale - gl.expand_dims(m_new, 1)   # one FMA per score
    p = gl.exp2(sc)
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _first_tile(it, q_s, k_smem, k_ready, k_empty, turn, rows, qk_scale, WG: gl.constexpr, NWG: gl.constexpr,
                BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr, CARRY: gl.constexpr):
    """Key tile 0 of a query tile (no PV yet; masked: the diagonal tile of the first query tile), ring
    position and phases from ``it`` as in ``_step``: (P_0, m, l, O = 0)."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    s = it % STAGES
    mbarrier.wait(k_ready.index(s), (it // STAGES) & 1)
    if PP:
        mbarrier.wait(turn.index(WG), it & 1)
    sacc = warpgroup_mma(q_s, k_smem.index(s).permute((1, 0)), gl.zeros([WM, BN], gl.float32, s_l),
                         use_acc=False, is_async=True)
    if PP:
        mbarrier.arrive(turn.index((WG + 1) % NWG))
    sacc = warpgroup_mma_wait(0, deps=(sacc, ))
    fence_async_shared()
    mbarrier.arrive(k_empty.index(s))
    m_i = gl.full([WM], -1.0e30, gl.float32, gl.SliceLayout(1, s_l))      # finite: no inf - inf
    l_i = gl.zeros([WM], gl.float32, gl.SliceLayout(1, s_l))
    p, alpha, m_i, l_i = _softmax(sacc, m_i, l_i, qk_scale, 0, rows, True, BN)
    return _carried(p, o_l, CARRY), m_i, l_i, gl.zeros([WM, HD], gl.float32, o_l)


@gluon.jit
def _step(j, it, o, p_prev, m_i, l_i, q_s, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, rows, qk_scale,
          pin_buf, WG: gl.constexpr, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr,
          PP: gl.constexpr, PIN: gl.constexpr, CARRY: gl.constexpr):
    """Key tile j >= 1: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued in this warpgroup's turn; softmax of
    S_j overlaps the PV product (and the other warpgroups' wgmmas). ``it``: the tile's count over the
    CTA's life, which sets the ring stage and the phases (= j here; the persistent kernel's walk)."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    s = it % STAGES
    sp = (it - 1) % STAGES
    mbarrier.wait(k_ready.index(s), (it // STAGES) & 1)
    mbarrier.wait(v_ready.index(sp), ((it - 1) // STAGES) & 1)
    if PP:
        mbarrier.wait(turn.index(WG), it & 1)
    sacc = warpgroup_mma(q_s, k_smem.index(s).permute((1, 0)), gl.zeros([WM, BN], gl.float32, s_l),
                         use_acc=False, is_async=True)
    o = warpgroup_mma(p_prev, v_smem.index(sp), o, is_async=True)
    if PP:
        mbarrier.arrive(turn.index((WG + 1) % NWG))
    sacc = warpgroup_mma_wait(1, deps=(sacc, ))              # S done; the PV product may still run
    fence_async_shared()
    mbarrier.arrive(k_empty.index(s))
    p, alpha, m_i, l_i = _softmax(sacc, m_i, l_i, qk_scale, j, rows, MASK, BN)
    if PIN:  # keep the softmax before the PV wait: ptxas hoists the wait above it otherwise (see NOTES)
        pin_buf.store(l_i)
    o = warpgroup_mma_wait(0, deps=(o, ))
    fence_async_shared()
    mbarrier.arrive(v_empty.index(sp))
    o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o.type.layout)), 1)
    return o, _carried(p, o_l, CARRY), m_i, l_i


@gluon.jit
def _to_a(p, o_l: gl.constexpr):
    """P [WM, BN] fp32 (wgmma accumulator layout) -> bf16 A operand of the PV wgmma (registers)."""
    return gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2))


@gluon.jit
def _carried(p, o_l: gl.constexpr, CARRY: gl.constexpr):
    """What a tile hands the next one: P [WM, BN] fp32, or (CARRY) already the bf16 A operand, so that the
    fp32 P is dead right after the softmax (3 warpgroups at 160 registers spill without it)."""
    if CARRY:
        res = _to_a(p, o_l)
    else:
        res = p
    return res


@gluon.jit
def _a_operand(p, o_l: gl.constexpr, CARRY: gl.constexpr):
    """The carried P as the PV wgmma's A operand (converted here unless CARRY did it already)."""
    if CARRY:
        res = p
    else:
        res = _to_a(p, o_l)
    return res


@gluon.jit
def _consumer(p, WG: gl.constexpr, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr,
              PIN: gl.constexpr, CARRY: gl.constexpr):
    """4 warps: query rows [m_start + 64 WG, + 64) of the CTA's head, every key tile, then the epilogue."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pin_smem, q_bar, k_ready, k_empty, v_ready, v_empty, turn,
     o_ptr, sink_ptr, stride_ot, stride_oh, qk_scale, q_start, q_len, m_start, h, hkv, n_full, n_tiles) = p
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    rows = m_start + WG * WM + gl.arange(0, WM, gl.SliceLayout(1, s_l))    # [WM] query index in the sequence
    q_s = q_smem.index(WG)                                                  # [WM, HD]
    pin_buf = pin_smem.index(WG)                                            # [WM] fp32 (PIN)
    mbarrier.wait(q_bar, 0)
    # ---- tile 0 (peeled: no PV yet; masked, as it is the diagonal tile of the first query tile) ----
    p, m_i, l_i, o = _first_tile(0, q_s, k_smem, k_ready, k_empty, turn, rows, qk_scale, WG, NWG, BN, STAGES, PP,
                                  CARRY)
    # ---- tiles every row of the CTA sees whole, then the diagonal tiles ----
    for j in range(1, n_full):
        o, p, m_i, l_i = _step(j, j, o, _a_operand(p, o_l, CARRY), m_i, l_i, q_s, k_smem, v_smem, k_ready,
                               k_empty, v_ready, v_empty, turn, rows, qk_scale, pin_buf, WG, NWG, BN, STAGES, False,
                               PP, PIN, CARRY)
    for j in range(gl.maximum(n_full, 1), n_tiles):
        o, p, m_i, l_i = _step(j, j, o, _a_operand(p, o_l, CARRY), m_i, l_i, q_s, k_smem, v_smem, k_ready,
                               k_empty, v_ready, v_empty, turn, rows, qk_scale, pin_buf, WG, NWG, BN, STAGES, True,
                               PP, PIN, CARRY)
    # ---- last PV, then the sink joins the softmax once ----
    last = n_tiles - 1
    sl = last % STAGES
    mbarrier.wait(v_ready.index(sl), (last // STAGES) & 1)
    o = warpgroup_mma(_a_operand(p, o_l, CARRY), v_smem.index(sl), o, is_async=True)
    o = warpgroup_mma_wait(0, deps=(o, ))
    mbarrier.arrive(v_empty.index(sl))
    _epilogue(o, m_i, l_i, sink_ptr, h, o_ptr, q_start, q_len, m_start + WG * WM, stride_ot, stride_oh)


@gluon.jit
def _epilogue(o, m_i, l_i, sink_ptr, h, o_ptr, q_start, q_len, row0, stride_ot, stride_oh):
    """The sink joins the softmax once; O / l [WM, HD] stored to rows [row0, row0 + WM) of the sequence
    (rows past its end masked)."""
    sink = gl.load(sink_ptr + h).to(gl.float32) * 1.4426950408889634
    m_f = gl.maximum(m_i, sink)
    alpha = gl.exp2(m_i - m_f)
    l_i = l_i * alpha + gl.exp2(sink - m_f)
    scale_r = gl.convert_layout(alpha / l_i, gl.SliceLayout(1, o.type.layout))
    st: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])    # 16-byte stores, 8 threads a row
    out = gl.convert_layout((o * gl.expand_dims(scale_r, 1)).to(o_ptr.dtype.element_ty), st)
    orow = row0 + gl.arange(0, WM, gl.SliceLayout(1, st))
    ocol = gl.arange(0, HD, gl.SliceLayout(0, st))
    ptrs = (o_ptr + gl.expand_dims((q_start + orow).to(gl.int64) * stride_ot, 1) + h * stride_oh
            + gl.expand_dims(ocol, 0))
    gl.store(ptrs, out, mask=gl.expand_dims(orow < q_len, 1))


@gluon.jit
def _consumer0(p, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr,
               PIN: gl.constexpr, CARRY: gl.constexpr):
    _consumer(p, 0, NWG, BN, STAGES, PP, PIN, CARRY)


@gluon.jit
def _consumer1(p, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr,
               PIN: gl.constexpr, CARRY: gl.constexpr):
    _consumer(p, 1, NWG, BN, STAGES, PP, PIN, CARRY)


@gluon.jit
def _consumer2(p, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr,
               PIN: gl.constexpr, CARRY: gl.constexpr):
    _consumer(p, 2, NWG, BN, STAGES, PP, PIN, CARRY)


@gluon.jit
def prefill_pingpong_kernel(q_desc, k_desc, v_desc, cu_ptr, sink_ptr, o_ptr, stride_ot, stride_oh, qk_scale,
                            GROUP: gl.constexpr, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                            CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr,
                            PP: gl.constexpr = True, PIN: gl.constexpr = True,
                            CARRY: gl.constexpr = False):
    """Grid (query tiles of BM = 64 NWG tokens, longest first; query heads; sequences)."""
    BM: gl.constexpr = NWG * WM
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    h = gl.program_id(1)
    b = gl.program_id(2)
    q_start = gl.load(cu_ptr + b)
    q_len = gl.load(cu_ptr + b + 1) - q_start
    m_start = pid_m * BM
    if m_start >= q_len:
        return
    m_end = gl.minimum(m_start + BM, q_len)
    n_tiles = gl.cdiv(m_end, BN)                  # keys [0, m_end)
    n_full = (m_start + 1) // BN                  # tiles whose every key every row of the CTA sees
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [NWG, WM, HD], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, HD], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, HD], v_desc.layout)
    pin_smem = gl.allocate_shared_memory(gl.float32, [NWG, WM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [NWG, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NWG)   # every consumer releases every stage
        mbarrier.init(v_empty.index(i), count=NWG)
    for i in gl.static_range(NWG):
        mbarrier.init(turn.index(i), count=1)
    fence_async_shared()
    mbarrier.arrive(turn.index(0))                   # warpgroup 0 has the first turn
    p = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pin_smem, q_bar, k_ready, k_empty, v_ready, v_empty, turn,
         o_ptr, sink_ptr, stride_ot, stride_oh, qk_scale, q_start, q_len, m_start, h, h // GROUP, n_full, n_tiles)
    if NWG == 2:  # (constexprs passed one by one: a shared tuple would turn them into tensors)
        gl.warp_specialize([(_consumer0, (p, NWG, BN, STAGES, PP, PIN, CARRY)),
                            (_consumer1, (p, NWG, BN, STAGES, PP, PIN, CARRY)),
                            (_producer, (p, NWG, BN, STAGES, PP, PIN, CARRY))], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([(_consumer0, (p, NWG, BN, STAGES, PP, PIN, CARRY)),
                            (_consumer1, (p, NWG, BN, STAGES, PP, PIN, CARRY)),
                            (_consumer2, (p, NWG, BN, STAGES, PP, PIN, CARRY)),
                            (_producer, (p, NWG, BN, STAGES, PP, PIN, CARRY))], [4, 4, 1],
                           [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


def _desc(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """[T, H, D] (D contiguous, rows 16-byte aligned) -> 2D descriptor over [T, H * D] with [rows, D] boxes."""
    T, H, D = t.shape
    block = [rows, D]
    return TensorDescriptor(t, [T, H * D], [t.stride(0), 1], block,
                            gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))


def prefill_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                      scale: float, window: int, max_seqlen_q: int, out: torch.Tensor,
                      config: GluonPrefillConfig | None = None, check_prefix: bool = True) -> torch.Tensor:
    """Same arguments as ``triton_attention_prefill.prefill_attention``; only the supported case (module
    docstring) runs, anything else raises ValueError. The paged cache is not read (no cached prefix).
    ``check_prefix`` reads ``cached_lens`` on the host (one device sync) to refuse a cached prefix."""
    cfg = config or DEFAULT
    check_supported(q, k, v, out, window, cfg.block_n, cfg.nwg)
    if cfg.persistent and cfg.nwg != 2:
        raise ValueError(f"the persistent Gluon prefill kernel has 2 consumer warpgroups (config asks {cfg.nwg})")
    if check_prefix and bool((cached_lens != 0).any()):
        raise ValueError("the Gluon prefill kernel supports no cached prefix (cached_lens must be all zero)")
    T, Hq, D = q.shape
    B = cached_lens.shape[0]
    if T == 0 or max_seqlen_q == 0:
        return out
    bn = cfg.block_n
    n_mt = triton.cdiv(max_seqlen_q, cfg.block_m)
    args = (_desc(q, 64), _desc(k, bn), _desc(v, bn), cu_seqlens_q, sinks, out, out.stride(0), out.stride(1),
            scale * LOG2E)
    consts = dict(GROUP=Hq // k.shape[1], NWG=cfg.nwg, BN=bn, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
                  PRODUCER_REGS=cfg.producer_regs, num_warps=4, maxnreg=cfg.maxnreg, PP=cfg.pingpong, PIN=cfg.pin,
                  CARRY=cfg.carry_a)
    if cfg.persistent:
        from .gluon_attention_prefill_persistent import prefill_pingpong_persistent_kernel as kern
        n_items = n_mt * Hq * B
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        kern[(min(n_items, sms), )](*args, n_mt, n_items, Hq, B, **consts)
    else:
        prefill_pingpong_kernel[(n_mt, Hq, B)](*args, **consts)
    return out


__all__ = ["CONFIGS", "DEFAULT", "RUN_CONFIGS", "GluonPrefillConfig", "prefill_attention", "prefill_pingpong_kernel",
           "tile_plan"]
