"""Warp-specialised FP8 block-scaled grouped GEMM of the fused MoE in Gluon (Hopper, sm_90).

Same operands, layout and epilogues as ``triton_moe_gemm_large`` (expert-sorted rows from
``triton_moe_align``, A quantized 1x128, W 128x128-block FP8, fp32 promotion after every 128-wide K
step), but with DeepGEMM's structure, which Triton 3.6 cannot express:
  * one producer warp issues the TMA loads of A [64, 128] and W [256, 128] into a STAGES-deep ring
    (mbarriers ``ready`` / ``empty``);
  * two consumer warpgroups each own 128 of the tile's 256 columns (one weight block): per K step
    async wgmma 64x128x128 -> wait -> release the stage -> promote ``acc += d * sa[row] * sb``.
    The two warpgroups are independent, so one promotes while the other's wgmma runs (Triton's single
    warpgroup pair waits for its own MMA before every promotion).
  * persistent: one CTA per SM walks the (used M block, N tile) tiles, grouped GROUP_M blocks at a
    time (WALK 1: groups inside each expert's run of blocks, ``_tile_mn``); the producer runs ahead
    into the next tile while the consumers do the epilogue.
Scales travel with the stage (TMA): the A row scales [1, 64] of the step from the group-major
a_scale_t, and the tile's two weight-block scales in one [8, 4] box (128-byte slots: a TMA destination
must be 128-byte aligned) of ``gluon_moe_gemm_run.block_scales_by_k``; the consumers read them from
shared memory while the wgmma runs (global loads in the K loop put L2 latency between the wgmmas).
A consumer whose half of a tile lies past N (last tile when N % 256 <= 128) only releases the stages.
Epilogues: EPI 1 = gate_up (``+ b1``, bf16 round, clamped SwiGLU on the interleaved gate/up columns,
1x128 FP8 quantization of h: the row amax of the 128 h columns spans both warpgroups and is exchanged
through shared memory); EPI 2 = down (``(+ b2) * routing weight``, rows scattered to pair order).

W is read through a 2D view [E * N, K]: rows past an expert's N belong to the next expert (or are
out of bounds, zero); those columns are masked in the epilogue (before the h amax). Measured in
bench/NOTES.md ("MoE prefill in Gluon"). This module imports triton's Gluon: only
``gluon_moe_gemm_run`` imports it, which ``triton_moe.moe_experts`` imports only when it takes this path.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

BM = gl.constexpr(64)     # rows of a tile (= the align block)
BK = gl.constexpr(128)    # K step (= one scale group)
WN = gl.constexpr(128)    # columns per consumer warpgroup (= one weight block)
BN = gl.constexpr(256)    # 2 * WN
FP8_MAX = gl.constexpr(448.0)
SCALE_FLOOR = gl.constexpr(1e-10)


@gluon.jit
def _count_used_blocks(block_expert_ptr, num_blocks, CH: gl.constexpr, num_warps: gl.constexpr):
    """Number of non-empty M blocks (the used ones come first, then -1s)."""
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [num_warps], [0])
    n = 0
    for b0 in range(0, num_blocks, CH):
        b = b0 + gl.arange(0, CH, layout)
        n += gl.sum((gl.load(block_expert_ptr + b, mask=b < num_blocks, other=-1) >= 0).to(gl.int32), axis=0)
    return n


@gluon.jit
def _tile_coords(tile, used_m, num_pid_n, GROUP_M: gl.constexpr):
    width = GROUP_M * num_pid_n
    first_m = (tile // width) * GROUP_M
    gsize = gl.minimum(used_m - first_m, GROUP_M)
    return first_m + (tile % width) % gsize, (tile % width) // gsize


@gluon.jit
def _tile_mn(tile, used_m, num_pid_n, span_ptr, GROUP_M: gl.constexpr, WALK: gl.constexpr):
    """(M block, N tile) of walk position ``tile``. WALK 0: groups of GROUP_M consecutive used blocks, N
    swept inside a group (a group can straddle two experts). WALK 1: the same inside each expert's run of
    blocks (span [block, 2] = the run's first block and length, ``AlignedPairs.block_span``): an expert's
    tiles occupy positions [first * N tiles, (first + blocks) * N tiles), so position // N tiles is one of
    its blocks, and no group mixes two experts' weight tiles (an expert's W tile is streamed once, by
    its blocks together)."""
    if WALK == 1:
        lb = tile // num_pid_n
        first = gl.load(span_ptr + 2 * lb)
        pid_m, pid_n = _tile_coords(tile - first * num_pid_n, gl.load(span_ptr + 2 * lb + 1), num_pid_n, GROUP_M)
        pid_m += first
    else:
        pid_m, pid_n = _tile_coords(tile, used_m, num_pid_n, GROUP_M)
    return pid_m, pid_n


@gluon.jit
def _producer(p, EPI: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, DIAG: gl.constexpr,
              WALK: gl.constexpr):
    """1 warp: TMA loads of A [BM, BK] and W [BN, BK] for every K step of every tile of this CTA."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    nk = gl.cdiv(K, BK)
    num_pid_n = gl.cdiv(N, BN)
    it = 0
    for tile in range(gl.program_id(0), used_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_mn(tile, used_m, num_pid_n, span_ptr, GROUP_M, WALK)
        e = gl.load(block_expert_ptr + pid_m)
        row_b = e * N + pid_n * BN
        col_sb = (pid_n * (BN // 128)) // 4 * 4                          # 16-byte aligned group of blocks
        for kb in range(nk):
            s = it % STAGES
            bar = ready.index(s)
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            if DIAG == 0:
                mbarrier.expect(bar, BM * BK + BN * BK + BM * 4 + 8 * 16)
                tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kb * BK], bar, a_bufs.index(s))
                tma.async_copy_global_to_shared(b_desc, [row_b, kb * BK], bar, b_bufs.index(s))
            else:  # timing diagnostics (wrong results): 1 = W tile only at kb 0, 2 = A tile only at kb 0
                first = kb == 0
                skip_bytes: gl.constexpr = BN * BK if DIAG == 1 else BM * BK
                mbarrier.expect(bar, BM * BK + BN * BK + BM * 4 + 8 * 16, pred=first)
                mbarrier.expect(bar, BM * BK + BN * BK + BM * 4 + 8 * 16 - skip_bytes, pred=not first)
                tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kb * BK], bar, a_bufs.index(s),
                                                pred=first or DIAG != 2)
                tma.async_copy_global_to_shared(b_desc, [row_b, kb * BK], bar, b_bufs.index(s),
                                                pred=first or DIAG != 1)
            tma.async_copy_global_to_shared(sa_desc, [kb, pid_m * BM], bar, sa_bufs.index(s))
            tma.async_copy_global_to_shared(sb_desc, [e * num_kb + kb, col_sb], bar, sb_bufs.index(s))
            it += 1


@gluon.jit
def _k_loop(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, d, it, nk, j_sb, WG: gl.constexpr, STAGES: gl.constexpr):
    """One tile's K loop of one consumer: acc [BM, WN] fp32 = sum over K steps of (wgmma 64x128x128)
    * sa[row] * sb. The scales come with the stage (TMA): read from shared memory while the MMA runs."""
    rows: gl.constexpr = gl.SliceLayout(1, d.type.layout)
    l4: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])                 # every thread holds the 4 scales
    sa_v = sa_bufs._reinterpret(gl.float32, [STAGES, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    sb_v = sb_bufs._reinterpret(gl.float32, [STAGES, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    pick = gl.arange(0, 4, l4) == j_sb
    acc = gl.zeros_like(d)
    for kb in range(nk):
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        b = b_bufs.index(s).slice(WG * WN, WN, dim=0).permute((1, 0))       # [BK, WN], K-major
        d = warpgroup_mma(a_bufs.index(s), b, d, use_acc=False, is_async=True)
        sb = gl.sum(gl.where(pick, sb_v.index(s).slice(0, 4).load(l4), 0.0), axis=0)
        r = sa_v.index(s).load(rows) * sb                                    # [BM] row scale of this step
        d = warpgroup_mma_wait(0, deps=(d, ))
        fence_async_shared()                                                  # our reads before the next TMA
        mbarrier.arrive(empty.index(s))                                       # both consumers -> refill
        acc += d * gl.expand_dims(r, 1)
        it += 1
    return acc, d, it


@gluon.jit
def _consumer0(p, EPI: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, DIAG: gl.constexpr,
               WALK: gl.constexpr):
    _consumer(p, 0, EPI, STAGES, GROUP_M, DIAG, WALK)


@gluon.jit
def _consumer1(p, EPI: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, DIAG: gl.constexpr,
               WALK: gl.constexpr):
    _consumer(p, 1, EPI, STAGES, GROUP_M, DIAG, WALK)


@gluon.jit
def _consumer(p, WG: gl.constexpr, EPI: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
              DIAG: gl.constexpr, WALK: gl.constexpr):
    """4 warps: columns [WG * WN, (WG + 1) * WN) of every tile of this CTA, K loop + epilogue."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, WN, 32])
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    nk = gl.cdiv(K, BK)
    num_pid_n = gl.cdiv(N, BN)
    it = 0
    tcount = 0
    d = gl.zeros([BM, WN], gl.float32, mma)
    for tile in range(gl.program_id(0), used_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_mn(tile, used_m, num_pid_n, span_ptr, GROUP_M, WALK)
        e = gl.load(block_expert_ptr + pid_m)
        n_w = pid_n * BN + WG * WN
        offs_m = pid_m * BM + gl.arange(0, BM, rows)                       # [BM]
        b_ok = n_w < N                                                     # this half has real columns
        if b_ok:
            acc, d, it = _k_loop(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, d, it, nk, (n_w // 128) % 4, WG,
                                 STAGES)
        else:  # the tile's last half past N (N % 256 <= 128): only release the stages
            for kb in range(nk):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                mbarrier.arrive(empty.index(s))
                it += 1
            acc = gl.zeros([BM, WN], gl.float32, mma)
        pair = gl.load(sorted_ids_ptr + offs_m)                              # num_pairs = padding row
        row_ok = pair < num_pairs
        offs_n = n_w + gl.arange(0, WN, gl.SliceLayout(0, mma))
        n_ok = offs_n < N
        bias = gl.load(bias_ptr + e.to(gl.int64) * stride_biase + offs_n, mask=n_ok, other=0.0).to(gl.float32)
        if EPI == 1:
            v = (acc + gl.expand_dims(bias, 0)).to(gl.bfloat16).to(gl.float32)  # rounds like the reference
            v = gl.where(gl.expand_dims(n_ok, 0), v, 0.0)
            gate, up = gl.split(gl.reshape(v, [BM, WN // 2, 2]))
            gate = gl.minimum(gate, limit)
            up = gl.minimum(gl.maximum(up, -limit), limit)
            h = (up + 1.0) * (gate / (1.0 + gl.exp(-alpha * gate)))
            h = h.to(gl.bfloat16).to(gl.float32)                                 # [BM, WN // 2]
            amax = gl.max(gl.abs(h), axis=1)
            slot = tcount % 2
            amax_smem.index(slot * 2 + WG).store(gl.convert_layout(amax, gl.BlockedLayout([1], [32], [4], [0])))
            mbarrier.arrive(xbar.index(slot))
            mbarrier.wait(xbar.index(slot), (tcount // 2) & 1)
            other = amax_smem.index(slot * 2 + 1 - WG).load(gl.BlockedLayout([1], [32], [4], [0]))
            amax = gl.maximum(gl.convert_layout(amax, other.type.layout), other)
            scale = gl.maximum(amax, SCALE_FLOOR) / FP8_MAX
            st: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])
            q = gl.convert_layout(h, st) / gl.expand_dims(gl.convert_layout(scale, gl.SliceLayout(1, st)), 1)
            om = pid_m * BM + gl.arange(0, BM, gl.SliceLayout(1, st))
            oh = n_w // 2 + gl.arange(0, WN // 2, gl.SliceLayout(0, st))
            ok = gl.expand_dims(gl.load(sorted_ids_ptr + om) < num_pairs, 1) & gl.expand_dims(oh < N // 2, 0)
            ptrs = c_ptr + gl.expand_dims(om.to(gl.int64) * stride_cm, 1) + gl.expand_dims(oh, 0)
            gl.store(ptrs, q.to(gl.float8e4nv), mask=ok)
            if WG == 0:
                sl: gl.constexpr = gl.SliceLayout(1, st)
                gl.store(cs_ptr + (n_w // BN) * stride_cs + om, gl.convert_layout(scale, sl),
                         mask=gl.load(sorted_ids_ptr + om) < num_pairs)
        else:
            w = gl.load(weights_ptr + gl.where(row_ok, pair, 0), mask=row_ok, other=0.0).to(gl.float32)
            out = (acc + gl.expand_dims(bias, 0)) * gl.expand_dims(w, 1)
            st2: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
            out = gl.convert_layout(out.to(c_ptr.dtype.element_ty), st2)
            prow = gl.convert_layout(pair, gl.SliceLayout(1, st2))
            on = n_w + gl.arange(0, WN, gl.SliceLayout(0, st2))
            ok = gl.expand_dims(prow < num_pairs, 1) & gl.expand_dims(on < N, 0)
            ptrs = c_ptr + gl.expand_dims(prow.to(gl.int64) * stride_cm, 1) + gl.expand_dims(on, 0)
            gl.store(ptrs, out, mask=ok)
        tcount += 1


@gluon.jit
def moe_gemm_ws_kernel(
    a_desc, sa_desc, b_desc, sb_desc, bias_ptr, c_ptr, cs_ptr,
    sorted_ids_ptr, block_expert_ptr, weights_ptr,
    num_blocks_m, N, K, num_pairs, num_kb,
    stride_biase, stride_cm, stride_cs,
    limit, alpha, span_ptr,
    EPI: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr, DIAG: gl.constexpr = 0, WALK: gl.constexpr = 0,
):
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK], b_desc.layout)
    sa_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], sa_desc.layout)
    sb_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 8, 4], sb_desc.layout)  # 128 B: TMA alignment
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    xbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    amax_smem = gl.allocate_shared_memory(gl.float32, [4, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # [slot * 2 + wg]
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)       # both consumer warpgroups release a stage
    for i in gl.static_range(2):
        mbarrier.init(xbar.index(i), count=2)
    fence_async_shared()
    used_m = _count_used_blocks(block_expert_ptr, num_blocks_m, 1024, num_warps)
    p = (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
         c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
         stride_cm, stride_cs, limit, alpha, span_ptr)
    gl.warp_specialize([(_consumer0, (p, EPI, STAGES, GROUP_M, DIAG, WALK)),
                        (_consumer1, (p, EPI, STAGES, GROUP_M, DIAG, WALK)),
                        (_producer, (p, EPI, STAGES, GROUP_M, DIAG, WALK))], [4, 1],
                       [CONSUMER_REGS, PRODUCER_REGS])
