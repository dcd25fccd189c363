"""Persistent variant of the Gluon ping-pong causal prefill (``gluon_attention_prefill``; read its docstring).

Opt-in (not the registered op's default): on the H200 (session 5) it passes its tests and gains at 8k
over the non-persistent two-warpgroup kernel (+3 %) but loses at 128k (-9 %); see bench/NOTES.md. Same
supported case, tiles, softmax, turns and epilogue; what changes is the CTA's lifetime. One CTA per SM
walks the work items (query tile, head, sequence), longest query tiles first, CTA i taking items i, i + P,
i + 2P, ... so that:
  * the producer runs ahead into the next item: it loads the next item's Q (two Q buffers, released by
    both consumers at the end of an item: ``q_empty``) and its first K/V tiles while the consumers finish
    the current item, so a CTA's Q load and first-tile latency are hidden after its first item (with one
    CTA per SM and no other CTA to fill the gap, the non-persistent kernel exposes them for every item);
  * a warpgroup's epilogue (last PV, sink, store) overlaps the other warpgroup's tiles.
Ring stages, their phases and the turns count key tiles over the whole walk (``it``); Q buffers and their
phases count items (``ic``). Items past a sequence's end (ragged batches) are skipped by every partition
alike. ``gluon_attention_schedule.simulate_protocol`` with several items replays these barriers.
Importing this module imports triton's Gluon.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .gluon_attention_prefill import HD, WM, _a_operand, _epilogue, _first_tile, _step


@gluon.jit
def _item(t, cu_ptr, n_mt, HQ, B, BM: gl.constexpr, BN: gl.constexpr):
    """Work item t -> (q_start, q_len, m_start, h, n_full, n_tiles); longest query tiles first."""
    mt = n_mt - 1 - t // (HQ * B)
    r = t % (HQ * B)
    h = r % HQ
    b = r // HQ
    q_start = gl.load(cu_ptr + b)
    q_len = gl.load(cu_ptr + b + 1) - q_start
    m_start = mt * BM
    m_end = gl.minimum(m_start + BM, q_len)
    return q_start, q_len, m_start, h, (m_start + 1) // BN, gl.cdiv(m_end, BN)


@gluon.jit
def _producer(p, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr, PIN: gl.constexpr,
              CARRY: gl.constexpr):
    """1 warp: per item, Q into buffer ic % 2 once both consumers released it, then K_j / V_j into the ring."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pin_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
     turn, o_ptr, sink_ptr, cu_ptr, stride_ot, stride_oh, qk_scale, n_mt, n_items, HQ, B, GROUP) = p
    it = 0
    ic = 0
    for t in range(gl.program_id(0), n_items, gl.num_programs(0)):
        q_start, q_len, m_start, h, n_full, n_tiles = _item(t, cu_ptr, n_mt, HQ, B, NWG * WM, BN)
        if m_start < q_len:
            qb = ic % 2
            mbarrier.wait(q_empty.index(qb), ((ic // 2) & 1) ^ 1)
            mbarrier.expect(q_ready.index(qb), NWG * WM * HD * 2)
            for g in gl.static_range(NWG):
                tma.async_copy_global_to_shared(q_desc, [q_start + m_start + g * WM, h * HD], q_ready.index(qb),
                                                q_smem.index(qb * NWG + g))
            hkv = h // GROUP
            for j in range(n_tiles):
                s = it % STAGES
                ph = ((it // STAGES) & 1) ^ 1
                row = q_start + j * BN
                mbarrier.wait(k_empty.index(s), ph)
                mbarrier.expect(k_ready.index(s), BN * HD * 2)
                tma.async_copy_global_to_shared(k_desc, [row, hkv * HD], k_ready.index(s), k_smem.index(s))
                mbarrier.wait(v_empty.index(s), ph)
                mbarrier.expect(v_ready.index(s), BN * HD * 2)
                tma.async_copy_global_to_shared(v_desc, [row, hkv * HD], v_ready.index(s), v_smem.index(s))
                it += 1
            ic += 1


@gluon.jit
def _consumer(p, WG: gl.constexpr, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr,
              PIN: gl.constexpr, CARRY: gl.constexpr):
    """4 warps: rows [m_start + 64 WG, + 64) of every item of this CTA."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pin_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
     turn, o_ptr, sink_ptr, cu_ptr, stride_ot, stride_oh, qk_scale, n_mt, n_items, HQ, B, GROUP) = p
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    pin_buf = pin_smem.index(WG)
    it = 0
    ic = 0
    for t in range(gl.program_id(0), n_items, gl.num_programs(0)):
        q_start, q_len, m_start, h, n_full, n_tiles = _item(t, cu_ptr, n_mt, HQ, B, NWG * WM, BN)
        if m_start < q_len:
            qb = ic % 2
            mbarrier.wait(q_ready.index(qb), (ic // 2) & 1)
            q_s = q_smem.index(qb * NWG + WG)
            rows = m_start + WG * WM + gl.arange(0, WM, gl.SliceLayout(1, s_l))
            pr, m_i, l_i, o = _first_tile(it, q_s, k_smem, k_ready, k_empty, turn, rows, qk_scale, WG, NWG, BN,
                                          STAGES, PP, CARRY)
            it += 1
            for j in range(1, n_full):
                o, pr, m_i, l_i = _step(j, it, o, _a_operand(pr, o_l, CARRY), m_i, l_i, q_s, k_smem, v_smem,
                                        k_ready, k_empty, v_ready, v_empty, turn, rows, qk_scale, pin_buf, WG, NWG,
                                        BN, STAGES, False, PP, PIN, CARRY)
                it += 1
            for j in range(gl.maximum(n_full, 1), n_tiles):
                o, pr, m_i, l_i = _step(j, it, o, _a_operand(pr, o_l, CARRY), m_i, l_i, q_s, k_smem, v_smem,
                                        k_ready, k_empty, v_ready, v_empty, turn, rows, qk_scale, pin_buf, WG, NWG,
                                        BN, STAGES, True, PP, PIN, CARRY)
                it += 1
            sl = (it - 1) % STAGES
            mbarrier.wait(v_ready.index(sl), ((it - 1) // STAGES) & 1)
            o = warpgroup_mma(_a_operand(pr, o_l, CARRY), v_smem.index(sl), o, is_async=True)
            o = warpgroup_mma_wait(0, deps=(o, ))
            fence_async_shared()
            mbarrier.arrive(v_empty.index(sl))
            mbarrier.arrive(q_empty.index(qb))        # every QK^T of this item has completed
            _epilogue(o, m_i, l_i, sink_ptr, h, o_ptr, q_start, q_len, m_start + WG * WM, stride_ot, stride_oh)
            ic += 1


@gluon.jit
def _consumer0(p, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr, PIN: gl.constexpr,
               CARRY: gl.constexpr):
    _consumer(p, 0, NWG, BN, STAGES, PP, PIN, CARRY)


@gluon.jit
def _consumer1(p, NWG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PP: gl.constexpr, PIN: gl.constexpr,
               CARRY: gl.constexpr):
    _consumer(p, 1, NWG, BN, STAGES, PP, PIN, CARRY)


@gluon.jit
def prefill_pingpong_persistent_kernel(q_desc, k_desc, v_desc, cu_ptr, sink_ptr, o_ptr, stride_ot, stride_oh,
                                       qk_scale, n_mt, n_items, HQ, B,
                                       GROUP: gl.constexpr, NWG: gl.constexpr, BN: gl.constexpr,
                                       STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                       PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr,
                                       PP: gl.constexpr = True, PIN: gl.constexpr = True,
                            CARRY: gl.constexpr = False):
    """Grid (programs <= SMs, ); n_items = n_mt query tiles x HQ heads x B sequences. Two consumer warpgroups."""
    gl.static_assert(NWG == 2, "the persistent kernel has two consumer warpgroups")
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2 * NWG, WM, HD], q_desc.layout)   # [buffer * NWG + wg]
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, HD], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, HD], v_desc.layout)
    pin_smem = gl.allocate_shared_memory(gl.float32, [NWG, WM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [NWG, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=NWG)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NWG)
        mbarrier.init(v_empty.index(i), count=NWG)
    for i in gl.static_range(NWG):
        mbarrier.init(turn.index(i), count=1)
    fence_async_shared()
    mbarrier.arrive(turn.index(0))
    p = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, pin_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
         v_empty, turn, o_ptr, sink_ptr, cu_ptr, stride_ot, stride_oh, qk_scale, n_mt, n_items, HQ, B, GROUP)
    gl.warp_specialize([(_consumer0, (p, NWG, BN, STAGES, PP, PIN, CARRY)),
                        (_consumer1, (p, NWG, BN, STAGES, PP, PIN, CARRY)),
                        (_producer, (p, NWG, BN, STAGES, PP, PIN, CARRY))], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
