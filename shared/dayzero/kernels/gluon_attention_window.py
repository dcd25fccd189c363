"""Sliding-window (w <= 128) causal prefill attention with sinks in Gluon (Hopper, sm_90). Opt-in, not wired.

Not yet run on a GPU (session 5: written and built for sm_90 on the CPU only; bench/NOTES.md "Gluon window
(session 5)"). ``bench/attention/gluon_window_run.sh`` tests and times it in one device call. Supported case:
window 1..128 (the gpt-oss sliding layers: 128, query - key < 128), head dim 64, bf16 q/k/v/out, any GQA
group, NO cached prefix (the keys are the new k/v of the call, read by TMA from the [T, H, D] tensors).
``window_attention`` checks this and raises ValueError otherwise.

Layout (``gluon_attention_window_schedule`` has the tile rules and a torch emulation of them):
  * a CTA: one query head x BM = 64 NWG consecutive new tokens of one sequence; grid (query heads, query
    tiles, sequences), heads fastest so that the GROUP CTAs sharing one KV head's window run side by side
    and read it from L2;
  * the CTA's whole key window [m_start - 128, m_start + BM) is resident in shared memory: NWG + 2 tiles
    of 64 keys, each tile with its own K and V mbarrier, loaded once by a producer warp (TMA), Q (NWG
    boxes [64, 64]) on one barrier. Nothing is reused, so there is no ring, no ``empty`` barrier and no
    turn: each consumer waits for what it reads and nothing else, and a warpgroup past the sequence's end
    simply exits. Latency is hidden by two CTAs per SM (launch cap 80 registers x 12 warps; 80 KB of
    shared memory each at NWG = 2), not inside a CTA;
  * consumer warpgroup g (64 query rows r0 = m_start + 64 g): three tiles g, g + 1, g + 2, FA3's order
    inside a warpgroup: S_i = Q K_i^T and O += P_{i-1} V_{i-1} issued together, the softmax of S_i under the
    PV product; the first and the diagonal tile masked (key <= query, query - key < window), the middle
    one not (w = 128). The softmax (middle tile), P -> bf16 A operand and the epilogue (the sink joins once,
    O / l stored, rows past the end masked) are ``gluon_attention_prefill``'s helpers.
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
from .gluon_attention_window_schedule import MAX_WINDOW, check_window_supported

BN = gl.constexpr(64)  # keys per tile


@dataclass(frozen=True)
class GluonWindowConfig:
    """Launch configuration. Registers: ``maxnreg`` (rounded up to 8) x 128 threads per warpgroup (NWG
    consumers, plus one for the producer warp when ``producer``) is the CTA's share of the SM's 65536;
    setmaxnreg moves the producer warpgroup's surplus to the consumers. Two CTAs per SM need <= 32768."""

    nwg: int = 2              # consumer warpgroups (64 query rows each)
    consumer_regs: int = 128
    producer_regs: int = 24
    maxnreg: int = 128
    producer: bool = False    # True: a producer warp issues the loads; False: the default warpgroup, first

    @property
    def block_m(self) -> int:
        return 64 * self.nwg


CONFIGS = {"w2": GluonWindowConfig(),                                                     # 2 CTAs per SM
           "w2_prod": GluonWindowConfig(consumer_regs=104, producer_regs=24, maxnreg=80, producer=True),
           "w3": GluonWindowConfig(nwg=3, consumer_regs=168, maxnreg=168),                # 1 CTA per SM
           "w2_1cta": GluonWindowConfig(consumer_regs=200, producer_regs=40, maxnreg=152, producer=True)}
DEFAULT = CONFIGS["w2"]


@gluon.jit
def _issue_loads(p, NWG: gl.constexpr):
    """All of the CTA's TMA loads, issued at once (nothing is reused, so nothing waits for a free slot): the
    NWG Q boxes on one barrier (a box past the sequence reads the next one's rows or TMA's zero fill past T:
    never stored), then K_i, V_i of every tile the CTA scores, each on its own barrier."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, o_ptr, sink_ptr, stride_ot, stride_oh,
     qk_scale, window, q_start, q_len, m_start, h, hkv, n_live, i_lo, i_hi) = p
    mbarrier.expect(q_bar, NWG * WM * HD * 2)
    for g in gl.static_range(NWG):
        tma.async_copy_global_to_shared(q_desc, [q_start + m_start + g * WM, h * HD], q_bar, q_smem.index(g))
    for i in range(i_lo, i_hi):
        row = q_start + m_start - 2 * BN + i * BN           # >= q_start: tiles before the sequence not loaded
        mbarrier.expect(k_bar.index(i), BN * HD * 2)
        tma.async_copy_global_to_shared(k_desc, [row, hkv * HD], k_bar.index(i), k_smem.index(i))
        mbarrier.expect(v_bar.index(i), BN * HD * 2)
        tma.async_copy_global_to_shared(v_desc, [row, hkv * HD], v_bar.index(i), v_smem.index(i))


@gluon.jit
def _producer(p, NWG: gl.constexpr, MID_MASK: gl.constexpr):
    """1 warp (PRODUCER configurations): the loads, while the consumers start."""
    _issue_loads(p, NWG)


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
    runs while the PV product does; then O *= alpha. Every barrier completes once (phase 0)."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    mbarrier.wait(k_bar.index(i), 0)
    mbarrier.wait(v_bar.index(i - 1), 0)
    sacc = warpgroup_mma(q_s, k_smem.index(i).permute((1, 0)), gl.zeros([WM, BN], gl.float32, s_l),
                         use_acc=False, is_async=True)
    o = warpgroup_mma(p_prev, v_smem.index(i - 1), o, is_async=True)
    sacc = warpgroup_mma_wait(1, deps=(sacc, ))              # S done; the PV product may still run
    if MASK:
        p, alpha, m_i, l_i = _softmax_masked(sacc, m_i, l_i, qk_scale, key0, rows, window)
    else:
        p, alpha, m_i, l_i = _softmax(sacc, m_i, l_i, qk_scale, 0, rows, False, BN)
    o = warpgroup_mma_wait(0, deps=(o, ))
    o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o.type.layout)), 1)
    return o, _to_a(p, o_l), m_i, l_i


@gluon.jit
def _consumer(p, WG: gl.constexpr, NWG: gl.constexpr, MID_MASK: gl.constexpr):
    """4 warps: query rows [r0, r0 + 64) of the CTA's head, tiles max(WG, i_lo) .. WG + 2, then the epilogue."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, o_ptr, sink_ptr, stride_ot, stride_oh,
     qk_scale, window, q_start, q_len, m_start, h, hkv, n_live, i_lo, i_hi) = p
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    if WG < n_live:
        r0 = m_start + WG * WM
        key_base = m_start - 2 * BN                                          # first key of tile 0
        rows = r0 + gl.arange(0, WM, gl.SliceLayout(1, s_l))                 # [WM] query index in the sequence
        q_s = q_smem.index(WG)                                               # [WM, HD]
        mbarrier.wait(q_bar, 0)
        # ---- the first tile (no PV yet), masked both ways ----
        i0 = gl.maximum(i_lo, WG)
        mbarrier.wait(k_bar.index(i0), 0)
        sacc = warpgroup_mma(q_s, k_smem.index(i0).permute((1, 0)), gl.zeros([WM, BN], gl.float32, s_l),
                             use_acc=False, is_async=True)
        sacc = warpgroup_mma_wait(0, deps=(sacc, ))
        m_i = gl.full([WM], -1.0e30, gl.float32, gl.SliceLayout(1, s_l))   # finite: no inf - inf
        l_i = gl.zeros([WM], gl.float32, gl.SliceLayout(1, s_l))
        pr, alpha, m_i, l_i = _softmax_masked(sacc, m_i, l_i, qk_scale, key_base + i0 * BN, rows, window)
        pa = _to_a(pr, o_l)
        o = gl.zeros([WM, HD], gl.float32, o_l)
        # ---- the middle tile (every key in the window when w = 128), if not already the first ----
        for i in range(i0 + 1, WG + 2):
            o, pa, m_i, l_i = _wstep(i, key_base + i * BN, o, pa, m_i, l_i, q_s, k_smem, v_smem, k_bar, v_bar,
                                     rows, qk_scale, window, MID_MASK)
        # ---- the diagonal tile, if not already the first ----
        if i0 < WG + 2:
            o, pa, m_i, l_i = _wstep(WG + 2, key_base + (WG + 2) * BN, o, pa, m_i, l_i, q_s, k_smem, v_smem,
                                     k_bar, v_bar, rows, qk_scale, window, True)
        # ---- last PV, then the sink joins the softmax once ----
        mbarrier.wait(v_bar.index(WG + 2), 0)
        o = warpgroup_mma(pa, v_smem.index(WG + 2), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=(o, ))
        _epilogue(o, m_i, l_i, sink_ptr, h, o_ptr, q_start, q_len, r0, stride_ot, stride_oh)


@gluon.jit
def _consumer0(p, NWG: gl.constexpr, MID_MASK: gl.constexpr):
    _consumer(p, 0, NWG, MID_MASK)


@gluon.jit
def _consumer1(p, NWG: gl.constexpr, MID_MASK: gl.constexpr):
    _consumer(p, 1, NWG, MID_MASK)


@gluon.jit
def _consumer2(p, NWG: gl.constexpr, MID_MASK: gl.constexpr):
    _consumer(p, 2, NWG, MID_MASK)


@gluon.jit
def window_kernel(q_desc, k_desc, v_desc, cu_ptr, sink_ptr, o_ptr, stride_ot, stride_oh, qk_scale, window,
                  GROUP: gl.constexpr, NWG: gl.constexpr, MID_MASK: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                  PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr, PRODUCER: gl.constexpr = False):
    """Grid (query heads, query tiles of BM = 64 NWG tokens, sequences)."""
    BM: gl.constexpr = NWG * WM
    NT: gl.constexpr = NWG + 2
    h = gl.program_id(0)
    b = gl.program_id(2)
    q_start = gl.load(cu_ptr + b)
    q_len = gl.load(cu_ptr + b + 1) - q_start
    m_start = gl.program_id(1) * BM
    if m_start >= q_len:
        return
    n_live = gl.minimum(gl.cdiv(q_len - m_start, WM), NWG)    # warpgroups with rows in the sequence
    i_lo = gl.maximum(2 - m_start // BN, 0)                   # tiles wholly before the sequence: skipped
    i_hi = n_live + 2                                         # tiles from the sequence's end on: not loaded
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [NWG, WM, HD], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [NT, BN, HD], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [NT, BN, HD], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [NT, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [NT, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NT):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)
    fence_async_shared()
    p = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, o_ptr, sink_ptr, stride_ot, stride_oh,
         qk_scale, window, q_start, q_len, m_start, h, h // GROUP, n_live, i_lo, i_hi)
    if PRODUCER:  # (constexprs passed one by one: a shared tuple would turn them into tensors)
        if NWG == 2:
            gl.warp_specialize([(_consumer0, (p, NWG, MID_MASK)), (_consumer1, (p, NWG, MID_MASK)),
                                (_producer, (p, NWG, MID_MASK))], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([(_consumer0, (p, NWG, MID_MASK)), (_consumer1, (p, NWG, MID_MASK)),
                                (_consumer2, (p, NWG, MID_MASK)), (_producer, (p, NWG, MID_MASK))], [4, 4, 1],
                               [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    else:  # the default warpgroup issues every load first, then the consumers start
        _issue_loads(p, NWG)
        if NWG == 2:
            gl.warp_specialize([(_consumer0, (p, NWG, MID_MASK)), (_consumer1, (p, NWG, MID_MASK))], [4],
                               [CONSUMER_REGS])
        else:
            gl.warp_specialize([(_consumer0, (p, NWG, MID_MASK)), (_consumer1, (p, NWG, MID_MASK)),
                                (_consumer2, (p, NWG, MID_MASK))], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])

def window_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                     scale: float, window: int, max_seqlen_q: int, out: torch.Tensor,
                     config: GluonWindowConfig | None = None, check_prefix: bool = True) -> torch.Tensor:
    """Same arguments as ``triton_attention_window.window_attention`` (the registered op's window path);
    only the supported case (module docstring) runs, anything else raises ValueError. The paged cache is not
    read. ``check_prefix`` reads ``cached_lens`` on the host (one device sync) to refuse a cached prefix.
    ``max_seqlen_q`` sizes the grid. Returns ``out``."""
    cfg = config or DEFAULT
    check_window_supported(q, k, v, out, window)
    if cfg.nwg not in (2, 3):
        raise ValueError(f"the Gluon window kernel has 2 or 3 consumer warpgroups (config asks {cfg.nwg})")
    if check_prefix and bool((cached_lens != 0).any()):
        raise ValueError("the Gluon window kernel supports no cached prefix (cached_lens must be all zero)")
    T, Hq, D = q.shape
    B = cached_lens.shape[0]
    if T == 0 or max_seqlen_q == 0:
        return out
    grid = (Hq, -(-max_seqlen_q // cfg.block_m), B)
    window_kernel[grid](_desc(q, 64), _desc(k, 64), _desc(v, 64), cu_seqlens_q, sinks, out, out.stride(0),
                        out.stride(1), scale * LOG2E, window, GROUP=Hq // k.shape[1], NWG=cfg.nwg,
                        MID_MASK=window < MAX_WINDOW, CONSUMER_REGS=cfg.consumer_regs,
                        PRODUCER_REGS=cfg.producer_regs, num_warps=4, maxnreg=cfg.maxnreg, PRODUCER=cfg.producer)
    return out


__all__ = ["CONFIGS", "DEFAULT", "GluonWindowConfig", "window_attention", "window_kernel"]
