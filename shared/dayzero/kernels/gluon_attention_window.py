"""Sliding-window (w <= 128) causal prefill attention with sinks in Gluon (Hopper, sm_90).

First run on an H200 at the end of session 5 (bench/NOTES.md "Gluon window (session 5)": correct in every
configuration, g4 best, 2.5x the byte floor); the ``pk*`` configurations run version 2
(``gluon_attention_window_packed``; first GPU run in session 6: correct, pk3s 1.76x the floor at 8k). The
registered op runs a ``pk*`` configuration for window-128 prefill (``triton_attention_prefill.gluon_window_choice``).
``bench/attention/gluon_window_run.sh`` tests and times them in one device call. Supported case:
window 1..128 (the gpt-oss sliding layers: 128, query - key < 128), head dim 64, bf16 q/k/v/out, any GQA
group, NO cached prefix (the keys are the new k/v of the call, read by TMA from the [T, H, D] tensors).
``window_attention`` checks this and raises ValueError otherwise.

Layout (``gluon_attention_window_schedule`` has the tile rules and a torch emulation of them):
  * a CTA: HPC query heads of one KV head x BM = 64 TB consecutive new tokens of one sequence; grid (head
    blocks, query tiles, sequences), heads fastest so that the CTAs sharing one KV head's window run side
    by side and read it from L2. TB x HW consumer warpgroups: warpgroup g takes token block g % TB (64 query
    rows) and heads (g // TB) HPC / HW .. one after the other. ``w*`` configurations: one head, TB = 2 or 3
    token blocks (keys shared between neighbouring rows); ``g*``: one token block, 2 .. 8 heads (the GQA
    group's heads share the CTA's K/V tiles: fewer L2 -> shared memory bytes);
  * the CTA's whole key window [m_start - 128, m_start + BM) is resident in shared memory: TB + 2 tiles
    of 64 keys, each tile with its own K and V mbarrier, every load issued once at the start (TMA; by the
    default warpgroup before the consumers start, or a producer warp), Q (TB x HPC boxes [64, 64]) each on
    its own barrier, each warpgroup's first head first. Nothing is reused, so there is no ring, no
    ``empty`` barrier and no turn: each consumer waits for what it reads and nothing else, and a warpgroup
    past the sequence's end simply exits. Latency is
    hidden by two CTAs per SM (w2, g2, g4: 8 warps x 128 registers, <= 96 KB of shared memory), not by a
    pipeline inside a CTA;
  * per 64 query rows r0 .. r0 + 63 of one head: three key tiles (keys r0 - 128 .. r0 + 63), FA3's order
    inside a warpgroup: S_i = Q K_i^T and O += P_{i-1} V_{i-1} issued together, the softmax of S_i under the
    PV product; the first tile masked (key <= query, query - key < window), the middle one not (w = 128),
    the diagonal causally only (``causal_diag``, w >= 64; both tests otherwise). The softmax (middle and
    causal diagonal tile), P -> bf16 A operand and the epilogue (the sink joins once, O / l stored, rows past
    the end masked) are ``gluon_attention_prefill``'s helpers.
Importing this module imports triton's Gluon.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .gluon_attention_prefill import HD, WM, _desc, _epilogue, _softmax, _to_a
from .gluon_attention_schedule import LOG2E
from .gluon_attention_window_packed import GluonWindowPackedConfig, window_packed_attention
from .gluon_attention_window_schedule import MAX_WINDOW, check_window_supported

BN = gl.constexpr(64)  # keys per tile


@dataclass(frozen=True)
class GluonWindowConfig:
    """Launch configuration. A CTA: ``hpc`` query heads of one KV head x ``tb`` blocks of 64 new tokens;
    ``tb * hw`` consumer warpgroups, warpgroup g on token block g % tb and heads (g // tb) * hpc / hw ..
    (one after the other). Registers: ``maxnreg`` (rounded up to 8) x 128 threads per warpgroup (the
    consumers, plus one for the producer warp when ``producer``) is the CTA's share of the SM's 65536;
    setmaxnreg moves the producer warpgroup's surplus to the consumers. Two CTAs per SM need <= 32768."""

    tb: int = 2               # token blocks of 64 rows per CTA (its key window: tb + 2 tiles of 64 keys)
    hw: int = 1               # warpgroups across the CTA's heads
    hpc: int = 1              # query heads per CTA (a divisor of the GQA group; hpc / hw per warpgroup)
    consumer_regs: int = 128
    producer_regs: int = 24
    maxnreg: int = 128
    producer: bool = False    # True: a producer warp issues the loads; False: the default warpgroup, first
    causal_diag: bool = True  # the diagonal tile tests key <= query only where the window spans it (w >= 64)

    @property
    def nwg(self) -> int:
        return self.tb * self.hw

    @property
    def block_m(self) -> int:
        return 64 * self.tb


CONFIGS = {"w2": GluonWindowConfig(),                                                     # 2 CTAs per SM
           "w2_prod": GluonWindowConfig(consumer_regs=104, producer_regs=24, maxnreg=80, producer=True),
           "w3": GluonWindowConfig(tb=3, consumer_regs=168, maxnreg=168),                 # 1 CTA per SM
           "w2_1cta": GluonWindowConfig(consumer_regs=200, producer_regs=40, maxnreg=152, producer=True),
           # GQA sharing: the CTA's warpgroups on several heads of one KV head, one token block (3 K/V tiles)
           "g2": GluonWindowConfig(tb=1, hw=2, hpc=2),                                     # 2 CTAs per SM
           # (causal_diag off: with it ptxas spills 6 / 2 in g4 / g8)
           "g4": GluonWindowConfig(tb=1, hw=2, hpc=4, causal_diag=False),                  # 2 CTAs per SM
           "g8": GluonWindowConfig(tb=1, hw=2, hpc=8, causal_diag=False),                  # 1 CTA per SM (smem)
           # version 2 (gluon_attention_window_packed): GQA-packed units, persistent walk, producer warp, unit ring
           "pk3": GluonWindowPackedConfig(),                                               # 3 slots, 173 KB
           "pk2": GluonWindowPackedConfig(stages=2),                                       # 2 slots, 121 KB
           # 3 consumer warpgroups (items round-robin: the prefill's pp3 shape), 160 registers each, each item in
           # turn (with the cross-item PV in flight ptxas spills 68 at 160 registers: not a configuration)
           "pk3s": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128),
           "pk2s": GluonWindowPackedConfig(serial=True),                                   # 2 in turn, 240 regs
           # 2 units a slot: 160 keys a row (1.25x) for half the K/V bytes (L2 -> SMEM 213 -> 146 MB at 8k); 72 KB
           # a slot, so 2 slots
           "pk3s_u2": GluonWindowPackedConfig(nc=3, serial=True, ups=2, stages=2, consumer_regs=160, producer_regs=24,
                                              maxnreg=128),
           "pk2_u2": GluonWindowPackedConfig(ups=2, stages=2),
           # session 6: O stored from the wgmma layout (no conversion scratch), so a 4th ring slot fits (the first
           # GPU run pointed at too few bytes in flight: pk3 / pk3s / pk2s within 3 %, whatever the consumers);
           # measured in call 2: the 4-byte stores cost more than the slot gains (pk3s_d 80.1 vs pk3s 63.1 us).
           # Removed in round 2: every configuration of 3 round-robin warpgroups with 2 or 4 one-unit slots (pk3s4,
           # pk3s4p, pk3s4p8, pk3sq4, pk3sq4p, pk3sq43d; diagnostics pkL2 / pkL4): a warpgroup skips phases of a
           # ready barrier there (``ring_waits_every_phase``), a race the load-only pkL2 lost on the GPU; and none was
           # faster (round 2: pk3sq4 69.8 / 260.4 us vs pk3s 63.4 / 246.9, pk3sq4p 85.1 / 314.3)
           "pk3s_d": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                             direct_store=True),
           "pk2s4": GluonWindowPackedConfig(serial=True, direct_store=True, stages=4),
           "pk34": GluonWindowPackedConfig(direct_store=True, stages=4),
           # and the producer prefetching Q / K / V rows 4 slots ahead into L2 (cp.async.bulk.prefetch: no smem)
           # (round 2: the prefetch costs ~20 %)
           "pk3sp": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=32, maxnreg=128,
                                            direct_store=True, prefetch=4),
           # session 6: O of whole units leaves by TMA from a staging buffer per warpgroup (no LSU stores, no layout
           # conversion); the partial last unit of a sequence stored masked (round 2: correct, +5 % / +13 % vs pk3s)
           "pk3st": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                            tma_store=True),
           # ... and through the item's own Q box instead (no staging buffer: 156 KB; round 2: +8 % / +6 %)
           "pk3sq": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                            store_via_q=True),
           # session 6 round 2: O through the Q box with 2 units a slot and 3 slots (216 KB: 6 units of buffering,
           # half the K/V L2 -> SMEM bytes, 160 keys a row; 4 spills): +40 % / +35 % vs pk3s
           "pk3squ2": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                              store_via_q=True, ups=2),
           # rows (token, head): each quad's Q as one 3D TMA box (2 Q loads a unit instead of 8), O out the same way
           # through the Q box (pk3sq3d) or by the converted 16-byte stores (pk3s3d). Round 2: pk3s3d 7 of 8 tests
           # (the 8th's torch reference ran out of GPU memory beside 7 other test processes), not timed
           "pk3s3d": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                             q3d=True),
           "pk3sq3d": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                              store_via_q=True, q3d=True),
           # round 2, CPU only (never run on a GPU): K / V in a mirrored ring of 16-key groups, each loaded once
           # (kv_ring: 4 KB of K / V a unit instead of 36 KB; the window a contiguous view), 3 / 6 Q slots
           "pk3sr": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                            kv_ring=True),
           "pk3sr6": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                             kv_ring=True, stages=6),
           "pk3sr3d": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                              kv_ring=True, q3d=True),
           # diagnostics (wrong output: timed by gluon_window_run.sh's GLUON_WINDOW_DIAG, never tested): pkL3 the
           # ring of 3 slots with consumers that only wait and release (the load stream's rate alone, pk3s's producer
           # unchanged), pkL3u2 the same with 2 units a slot, pkL33d with q3d; pk3s_ns pk3s without the O store
           "pkL3": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                           diag=1),
           "pkL3u2": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                             ups=2, diag=1),
           "pk3s_ns": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                              diag=2),
           "pkL33d": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                             q3d=True, diag=1),
           "pkLr": GluonWindowPackedConfig(nc=3, serial=True, consumer_regs=160, producer_regs=24, maxnreg=128,
                                           kv_ring=True, diag=1)}
# diagnostics: timed only (gluon_window_run.sh GLUON_WINDOW_DIAG), never tested or registered
DIAG_CONFIGS = ("pkL3", "pkL3u2", "pk3s_ns", "pkL33d", "pkLr")
DEFAULT = CONFIGS["w2"]
# what gluon_window_run.sh tests and times by default: version 1's best (g4) beside version 2's two best (pk3s: the
# registered op's default since session 6; pk2s). Session 6 (bench/NOTES.md "Gluon window on the GPU"): pk3 /
# pk3s_u2 slower (call 1); the direct_store configurations slower still (call 2: pk3s_d +27 %, pk3s4p8 +48 %,
# pk2s4 +67 % at 8k); pk3s4 / pk34 / pk3sp / pk3s4p passed 7 of 8 tests (the 8th ran out of GPU memory beside the
# registered suites) and were not timed; round 2: the TMA-store variants (pk3st, pk3sq) and pk3squ2 correct and
# slower. w2 / g2 / g8 / w3 ran in session 5, w2_prod spills, w2_1cta is a diagnostic
RUN_CONFIGS = ("g4", "pk3s", "pk2s")


@gluon.jit
def _load_q(p, hl, t, TB: gl.constexpr):
    """Q box [64 rows, 64] of the CTA's head hl, token block t, on its own barrier, if the block has rows in
    the sequence (a live warpgroup waits for every copy issued: none is in flight when the CTA exits). Rows
    of the box past the sequence read the next one's or TMA's zero fill past T: never stored."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, o_ptr, sink_ptr, stride_ot, stride_oh,
     qk_scale, window, q_start, q_len, m_start, h0, hkv, n_live, i_lo, i_hi) = p
    if t < n_live:
        mbarrier.expect(q_bar.index(hl * TB + t), WM * HD * 2)
        tma.async_copy_global_to_shared(q_desc, [q_start + m_start + t * WM, (h0 + hl) * HD],
                                        q_bar.index(hl * TB + t), q_smem.index(hl * TB + t))


@gluon.jit
def _issue_loads(p, TB: gl.constexpr, HW: gl.constexpr, HPC: gl.constexpr):
    """All of the CTA's TMA loads, issued at once (nothing is reused, so nothing waits for a free slot): the
    Q boxes of each warpgroup's first head, then K_i, V_i of every tile the CTA scores, each on its own
    barrier, then the other heads' Q boxes."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, o_ptr, sink_ptr, stride_ot, stride_oh,
     qk_scale, window, q_start, q_len, m_start, h0, hkv, n_live, i_lo, i_hi) = p
    HPW: gl.constexpr = HPC // HW
    for w in gl.static_range(HW):
        for t in gl.static_range(TB):
            _load_q(p, w * HPW, t, TB)
    for i in range(i_lo, i_hi):
        row = q_start + m_start - 2 * BN + i * BN           # >= q_start: tiles before the sequence not loaded
        mbarrier.expect(k_bar.index(i), BN * HD * 2)
        tma.async_copy_global_to_shared(k_desc, [row, hkv * HD], k_bar.index(i), k_smem.index(i))
        mbarrier.expect(v_bar.index(i), BN * HD * 2)
        tma.async_copy_global_to_shared(v_desc, [row, hkv * HD], v_bar.index(i), v_smem.index(i))
    for w in gl.static_range(HW):
        for j in gl.static_range(1, HPW):
            for t in gl.static_range(TB):
                _load_q(p, w * HPW + j, t, TB)


@gluon.jit
def _producer(p, TB: gl.constexpr, HW: gl.constexpr, HPC: gl.constexpr, MID_MASK: gl.constexpr,
               DIAG_MASK: gl.constexpr):
    """1 warp (``producer`` configurations): the loads, while the consumers start."""
    _issue_loads(p, TB, HW, HPC)


@gluon.jit
def _softmax_masked(sacc, m_i, l_i, qk_scale, key0, rows, window):
    """Online softmax step (base 2) of a masked tile: key key0 + c visible to row r iff key <= r and
    r - key < window. sacc [WM, BN] raw scores -> p [WM, BN] fp32, alpha [WM], new running max / sum."""
    cols = key0 + gl.arange(0, BN, gl.SliceLayout(0, sacc.type.layout))
    d = gl.expand_dims(rows, 1) - gl.expand_dims(cols, 0)                    # query - key
    sc = gl.where((d >= 0) & (d < window), sacc * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sc, axis=1))
    p = gl.exp2(sc - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _wstep(i, key0, o, p_prev, m_i, l_i, q_s, k_smem, v_smem, k_bar, v_bar, rows, qk_scale, window,
           MASK: gl.constexpr):
    """Tile i after the first: S_i = Q K_i^T and O += P_{i-1} V_{i-1} issued together; the softmax of S_i
    runs while the PV product does; then O *= alpha. Every barrier completes once (phase 0). MASK: 0 none,
    1 causal and window, 2 causal only."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    mbarrier.wait(k_bar.index(i), 0)
    mbarrier.wait(v_bar.index(i - 1), 0)
    sacc = warpgroup_mma(q_s, k_smem.index(i).permute((1, 0)), gl.zeros([WM, BN], gl.float32, s_l),
                         use_acc=False, is_async=True)
    o = warpgroup_mma(p_prev, v_smem.index(i - 1), o, is_async=True)
    sacc = warpgroup_mma_wait(1, deps=(sacc, ))              # S done; the PV product may still run
    if MASK == 1:    # key <= query and query - key < window
        p, alpha, m_i, l_i = _softmax_masked(sacc, m_i, l_i, qk_scale, key0, rows, window)
    elif MASK == 2:  # key <= query only (the diagonal tile when the window spans it: w >= 64)
        p, alpha, m_i, l_i = _softmax(sacc, m_i, l_i, qk_scale, key0 // BN, rows, True, BN)
    else:            # every key visible
        p, alpha, m_i, l_i = _softmax(sacc, m_i, l_i, qk_scale, 0, rows, False, BN)
    o = warpgroup_mma_wait(0, deps=(o, ))
    o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o.type.layout)), 1)
    return o, _to_a(p, o_l), m_i, l_i


@gluon.jit
def _attend(q_s, h, tb, p, MID_MASK: gl.constexpr, DIAG_MASK: gl.constexpr):
    """Query rows [r0, r0 + 64) (token block tb of the CTA) of head h: tiles max(tb, i_lo) .. tb + 2 of the
    resident window, then the epilogue. MID_MASK / DIAG_MASK: the middle / diagonal tile's mask (``_wstep``)."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, o_ptr, sink_ptr, stride_ot, stride_oh,
     qk_scale, window, q_start, q_len, m_start, h0, hkv, n_live, i_lo, i_hi) = p
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    r0 = m_start + tb * WM
    key_base = m_start - 2 * BN                                              # first key of tile 0
    rows = r0 + gl.arange(0, WM, gl.SliceLayout(1, s_l))                     # [WM] query index in the sequence
    # ---- the first tile (no PV yet), masked both ways ----
    i0 = gl.maximum(i_lo, tb)
    mbarrier.wait(k_bar.index(i0), 0)
    sacc = warpgroup_mma(q_s, k_smem.index(i0).permute((1, 0)), gl.zeros([WM, BN], gl.float32, s_l),
                         use_acc=False, is_async=True)
    sacc = warpgroup_mma_wait(0, deps=(sacc, ))
    m_i = gl.full([WM], -1.0e30, gl.float32, gl.SliceLayout(1, s_l))       # finite: no inf - inf
    l_i = gl.zeros([WM], gl.float32, gl.SliceLayout(1, s_l))
    # (both tests: the window's edge, or at a sequence's start the middle or diagonal tile; a run-time
    # choice of mask here duplicates the softmax and makes g4 / g8 spill)
    pr, alpha, m_i, l_i = _softmax_masked(sacc, m_i, l_i, qk_scale, key_base + i0 * BN, rows, window)
    pa = _to_a(pr, o_l)
    o = gl.zeros([WM, HD], gl.float32, o_l)
    # ---- the middle tile (every key in the window when w = 128), if not already the first ----
    for i in range(i0 + 1, tb + 2):
        o, pa, m_i, l_i = _wstep(i, key_base + i * BN, o, pa, m_i, l_i, q_s, k_smem, v_smem, k_bar, v_bar,
                                 rows, qk_scale, window, MID_MASK)
    # ---- the diagonal tile, if not already the first (causal only when the window spans it) ----
    if i0 < tb + 2:
        o, pa, m_i, l_i = _wstep(tb + 2, key_base + (tb + 2) * BN, o, pa, m_i, l_i, q_s, k_smem, v_smem,
                                 k_bar, v_bar, rows, qk_scale, window, DIAG_MASK)
    # ---- last PV, then the sink joins the softmax once ----
    mbarrier.wait(v_bar.index(tb + 2), 0)
    o = warpgroup_mma(pa, v_smem.index(tb + 2), o, is_async=True)
    o = warpgroup_mma_wait(0, deps=(o, ))
    _epilogue(o, m_i, l_i, sink_ptr, h, o_ptr, q_start, q_len, r0, stride_ot, stride_oh)


@gluon.jit
def _consumer(p, WG: gl.constexpr, TB: gl.constexpr, HW: gl.constexpr, HPC: gl.constexpr, MID_MASK: gl.constexpr,
               DIAG_MASK: gl.constexpr):
    """4 warps: token block WG % TB of the CTA, heads (WG // TB) * HPC / HW .. one after the other."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, o_ptr, sink_ptr, stride_ot, stride_oh,
     qk_scale, window, q_start, q_len, m_start, h0, hkv, n_live, i_lo, i_hi) = p
    tb: gl.constexpr = WG % TB
    HPW: gl.constexpr = HPC // HW
    if tb < n_live:
        for j in range(HPW):  # head (WG // TB) * HPW + j of the CTA (rolled: unrolled, ptxas overlaps heads, spills)
            box = ((WG // TB) * HPW + j) * TB + tb
            mbarrier.wait(q_bar.index(box), 0)
            _attend(q_smem.index(box), h0 + (WG // TB) * HPW + j, tb, p, MID_MASK, DIAG_MASK)


@gluon.jit
def _consumer0(p, TB: gl.constexpr, HW: gl.constexpr, HPC: gl.constexpr, MID_MASK: gl.constexpr,
               DIAG_MASK: gl.constexpr):
    _consumer(p, 0, TB, HW, HPC, MID_MASK, DIAG_MASK)


@gluon.jit
def _consumer1(p, TB: gl.constexpr, HW: gl.constexpr, HPC: gl.constexpr, MID_MASK: gl.constexpr,
               DIAG_MASK: gl.constexpr):
    _consumer(p, 1, TB, HW, HPC, MID_MASK, DIAG_MASK)


@gluon.jit
def _consumer2(p, TB: gl.constexpr, HW: gl.constexpr, HPC: gl.constexpr, MID_MASK: gl.constexpr,
               DIAG_MASK: gl.constexpr):
    _consumer(p, 2, TB, HW, HPC, MID_MASK, DIAG_MASK)


@gluon.jit
def _consumer3(p, TB: gl.constexpr, HW: gl.constexpr, HPC: gl.constexpr, MID_MASK: gl.constexpr,
               DIAG_MASK: gl.constexpr):
    _consumer(p, 3, TB, HW, HPC, MID_MASK, DIAG_MASK)


@gluon.jit
def window_kernel(q_desc, k_desc, v_desc, cu_ptr, sink_ptr, o_ptr, stride_ot, stride_oh, qk_scale, window,
                  GROUP: gl.constexpr, TB: gl.constexpr, HW: gl.constexpr, HPC: gl.constexpr,
                  MID_MASK: gl.constexpr, DIAG_MASK: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                  PRODUCER_REGS: gl.constexpr,
                  num_warps: gl.constexpr, PRODUCER: gl.constexpr = False):
    """Grid (query-head blocks of HPC, query tiles of BM = 64 TB tokens, sequences)."""
    BM: gl.constexpr = TB * WM
    NT: gl.constexpr = TB + 2
    NWG: gl.constexpr = TB * HW
    h0 = gl.program_id(0) * HPC
    b = gl.program_id(2)
    q_start = gl.load(cu_ptr + b)
    q_len = gl.load(cu_ptr + b + 1) - q_start
    m_start = gl.program_id(1) * BM
    if m_start >= q_len:
        return
    n_live = gl.minimum(gl.cdiv(q_len - m_start, WM), TB)     # token blocks with rows in the sequence
    i_lo = gl.maximum(2 - m_start // BN, 0)                   # tiles wholly before the sequence: skipped
    i_hi = n_live + 2                                         # tiles from the sequence's end on: not loaded
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [HPC * TB, WM, HD], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [NT, BN, HD], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [NT, BN, HD], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [HPC * TB, 1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [NT, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [NT, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(HPC * TB):
        mbarrier.init(q_bar.index(i), count=1)
    for i in gl.static_range(NT):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)
    fence_async_shared()
    p = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, o_ptr, sink_ptr, stride_ot, stride_oh,
         qk_scale, window, q_start, q_len, m_start, h0, h0 // GROUP, n_live, i_lo, i_hi)
    # (constexprs written out in each tuple: a shared tuple of them would turn them into tensors)
    if not PRODUCER:  # the default warpgroup issues every load first, then the consumers start
        _issue_loads(p, TB, HW, HPC)
    if PRODUCER:
        if NWG == 2:
            gl.warp_specialize([(_consumer0, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                                (_consumer1, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                                (_producer, (p, TB, HW, HPC, MID_MASK, DIAG_MASK))], [4, 1],
                               [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([(_consumer0, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                                (_consumer1, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                                (_consumer2, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                                (_producer, (p, TB, HW, HPC, MID_MASK, DIAG_MASK))], [4, 4, 1],
                               [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    elif NWG == 2:
        gl.warp_specialize([(_consumer0, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                            (_consumer1, (p, TB, HW, HPC, MID_MASK, DIAG_MASK))], [4], [CONSUMER_REGS])
    elif NWG == 3:
        gl.warp_specialize([(_consumer0, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                            (_consumer1, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                            (_consumer2, (p, TB, HW, HPC, MID_MASK, DIAG_MASK))], [4, 4],
                           [CONSUMER_REGS, CONSUMER_REGS])
    else:
        gl.warp_specialize([(_consumer0, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                            (_consumer1, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                            (_consumer2, (p, TB, HW, HPC, MID_MASK, DIAG_MASK)),
                            (_consumer3, (p, TB, HW, HPC, MID_MASK, DIAG_MASK))], [4, 4, 4],
                           [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])

def window_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                     scale: float, window: int, max_seqlen_q: int, out: torch.Tensor,
                     config: GluonWindowConfig | GluonWindowPackedConfig | None = None,
                     check_prefix: bool = True) -> torch.Tensor:
    """Same arguments as ``triton_attention_window.window_attention`` (the registered op's window path);
    only the supported case (module docstring) runs, anything else raises ValueError. The paged cache is not
    read. ``check_prefix`` reads ``cached_lens`` on the host (one device sync) to refuse a cached prefix.
    ``max_seqlen_q`` sizes the grid. Returns ``out``."""
    cfg = config or DEFAULT
    check_window_supported(q, k, v, out, window)
    T, Hq, D = q.shape
    group = Hq // k.shape[1]
    if isinstance(cfg, GluonWindowPackedConfig):
        if check_prefix and bool((cached_lens != 0).any()):
            raise ValueError("the Gluon window kernel supports no cached prefix (cached_lens must be all zero)")
        if T == 0 or max_seqlen_q == 0:
            return out
        return window_packed_attention(q, k, v, cu_seqlens_q, sinks, scale, window, max_seqlen_q, out, cfg)
    if cfg.nwg not in (2, 3, 4) or (cfg.producer and cfg.nwg == 4) or cfg.hpc % cfg.hw or group % cfg.hpc:
        raise ValueError(f"the Gluon window kernel runs 2-4 consumer warpgroups (3 with a producer), hpc a "
                         f"multiple of hw and a divisor of the GQA group {group}; config {cfg}")
    if check_prefix and bool((cached_lens != 0).any()):
        raise ValueError("the Gluon window kernel supports no cached prefix (cached_lens must be all zero)")
    B = cached_lens.shape[0]
    if T == 0 or max_seqlen_q == 0:
        return out
    grid = (Hq // cfg.hpc, -(-max_seqlen_q // cfg.block_m), B)
    window_kernel[grid](_desc(q, 64), _desc(k, 64), _desc(v, 64), cu_seqlens_q, sinks, out, out.stride(0),
                        out.stride(1), scale * LOG2E, window, GROUP=group, TB=cfg.tb, HW=cfg.hw, HPC=cfg.hpc,
                        MID_MASK=int(window < MAX_WINDOW),
                        DIAG_MASK=2 if cfg.causal_diag and window >= 64 else 1, CONSUMER_REGS=cfg.consumer_regs,
                        PRODUCER_REGS=cfg.producer_regs, num_warps=4, maxnreg=cfg.maxnreg, PRODUCER=cfg.producer)
    return out


__all__ = ["CONFIGS", "DEFAULT", "DIAG_CONFIGS", "RUN_CONFIGS", "GluonWindowConfig", "GluonWindowPackedConfig",
           "window_attention",
           "window_kernel"]
