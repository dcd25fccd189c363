"""Gluon MoE GEMM with 128-row tiles: the two consumer warpgroups split M and share the W tile (Hopper).

Same operands, numerics and epilogues as ``gluon_moe_gemm`` (read its docstring first), but a tile is
128 rows (one 128-row align block) x 256 columns:
  * the producer warp TMA-loads A [128, 128] and W [256, 128] per K step (48 KB, half the W bytes per
    FLOP of the 64x256 tile: W is the L2 -> shared-memory traffic that bounds the 64-row kernel,
    bench/NOTES.md "Gluon run 4");
  * consumer warpgroup g owns rows [64 g, 64 g + 64) and all 256 columns, as two fp32 accumulators of
    64x128 (one weight block each). Per K step: wgmma 64x128x128 on the first weight block -> wait ->
    promote into acc0, then the same for the second block into acc1 (two 64x128 results held at once
    would not fit in 240 registers with the two accumulators); the other warpgroup's wgmma runs while
    one promotes. A stage is released after both.
  * a *half tile* (rows 64-127 all padding: the expert's run ends in the first half): by default the
    consumers split N for it as in ``gluon_moe_gemm`` (HALF 0); HALF 1 gives it to warpgroup 0 alone;
    HALF 2 splits N and loads only A's 64 real rows (A as two 64-row boxes, the second skipped);
    HALF 3 = HALF 2 with a half tile's W loaded at its first K step only (timing diagnostic, wrong
    results); a weight block past N skips its wgmma.
Gate_up epilogue: a row's 128 h columns (one 1x128 quantization group) are all in one warpgroup, so
the row amax needs no exchange. Down epilogue: ``(+ b2) * routing weight``, rows scattered to pair order.
The tile bodies (K loops, epilogues) are in ``gluon_moe_tile128``. Tiles go to CTAs round-robin (SCHED 0)
or, with SCHED 1, to whichever CTA frees up first (a global counter, ``gluon_moe_sched``).
Imported only by ``gluon_moe_gemm_run`` (Gluon path selected).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .gluon_moe_gemm import _count_used_blocks, _tile_mn
from .gluon_moe_sched import _next, _publish, _receive
from .gluon_moe_tile128 import _full_tile, _half_tile
from .gluon_moe_trace import _now, _trace

BM = gl.constexpr(128)    # rows of a tile (= the align block)
HM = gl.constexpr(64)     # rows per consumer warpgroup
BK = gl.constexpr(128)    # K step (= one scale group)
WN = gl.constexpr(128)    # one weight block of columns
BN = gl.constexpr(256)    # two 128-wide weight blocks


@gluon.jit
def _load_tile(p, pid_m, pid_n, e, full, it, STAGES: gl.constexpr, HALF: gl.constexpr, OPT: gl.constexpr):
    """The TMA loads of one tile's K steps (A [BM, BK], W [BN, BK], the step's scales); returns it.
    HALF >= 2: A as two [HM, BK] boxes, the second skipped for a half tile; HALF 3 (timing diagnostic,
    wrong results) also loads a half tile's W only at its first K step. OPT & 2 (``GluonConfig.wsplit``,
    HALF 0-2): W as two [WN, BK] boxes (one per weight block), the second skipped where that block lies
    past N (the last N tile when N % 256 <= 128: its rows are the next expert's, never multiplied)."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    row_b = e * N + pid_n * BN
    col_sb = (pid_n * (BN // 128)) // 4 * 4                              # 16-byte aligned group of blocks
    for kb in range(gl.cdiv(K, BK)):
        s = it % STAGES
        bar = ready.index(s)
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        if (OPT & 2) != 0:
            has1 = pid_n * BN + WN < N                                    # weight block 1 has columns
            a_all = full or HALF < 2                                      # A's rows 64-127 loaded
            mbarrier.expect(bar, BM * BK + BN * BK + BM * 4 + 8 * 16, pred=a_all and has1)
            mbarrier.expect(bar, BM * BK + WN * BK + BM * 4 + 8 * 16, pred=a_all and not has1)
            mbarrier.expect(bar, HM * BK + BN * BK + BM * 4 + 8 * 16, pred=(not a_all) and has1)
            mbarrier.expect(bar, HM * BK + WN * BK + BM * 4 + 8 * 16, pred=(not a_all) and not has1)
            if HALF < 2:
                tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kb * BK], bar, a_bufs.index(s))
            else:
                tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kb * BK], bar, a_bufs.index(s).slice(0, HM))
                tma.async_copy_global_to_shared(a_desc, [pid_m * BM + HM, kb * BK], bar,
                                                a_bufs.index(s).slice(HM, HM), pred=full)
            tma.async_copy_global_to_shared(b_desc, [row_b, kb * BK], bar, b_bufs.index(s).slice(0, WN))
            tma.async_copy_global_to_shared(b_desc, [row_b + WN, kb * BK], bar, b_bufs.index(s).slice(WN, WN),
                                            pred=has1)
        elif HALF < 2:
            mbarrier.expect(bar, BM * BK + BN * BK + BM * 4 + 8 * 16)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kb * BK], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [row_b, kb * BK], bar, b_bufs.index(s))
        else:
            w_on = full or kb == 0 or HALF != 3
            mbarrier.expect(bar, BM * BK + BN * BK + BM * 4 + 8 * 16, pred=full)
            mbarrier.expect(bar, HM * BK + BN * BK + BM * 4 + 8 * 16, pred=(not full) and w_on)
            mbarrier.expect(bar, HM * BK + BM * 4 + 8 * 16, pred=not w_on)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kb * BK], bar, a_bufs.index(s).slice(0, HM))
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM + HM, kb * BK], bar, a_bufs.index(s).slice(HM, HM),
                                            pred=full)
            tma.async_copy_global_to_shared(b_desc, [row_b, kb * BK], bar, b_bufs.index(s), pred=w_on)
        tma.async_copy_global_to_shared(sa_desc, [kb, pid_m * BM], bar, sa_bufs.index(s))
        tma.async_copy_global_to_shared(sb_desc, [e * num_kb + kb, col_sb], bar, sb_bufs.index(s))
        it += 1
    return it


@gluon.jit
def _producer(p, sq, EPI: gl.constexpr, OPT: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
              HALF: gl.constexpr, WALK: gl.constexpr, SCHED: gl.constexpr):
    """1 warp: the loads of every K step of every tile of this CTA (SCHED 1: tiles taken from the global
    counter and handed to the consumers, ``gluon_moe_sched``)."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    num_pid_n = gl.cdiv(N, BN)
    it = 0
    if SCHED == 0:
        for tile in range(gl.program_id(0), used_m * num_pid_n, gl.num_programs(0)):
            it = _produce(p, tile, it, num_pid_n, STAGES, GROUP_M, HALF, WALK, OPT)
    else:
        tiles_smem, tfull, tempty, counter_ptr = sq
        tile = gl.program_id(0)
        k = 0
        while tile < used_m * num_pid_n:
            _publish(tiles_smem, tfull, tempty, k, tile)
            it = _produce(p, tile, it, num_pid_n, STAGES, GROUP_M, HALF, WALK, OPT)
            k += 1
            tile = _next(counter_ptr)
        _publish(tiles_smem, tfull, tempty, k, used_m * num_pid_n)          # the end


@gluon.jit
def _produce(p, tile, it, num_pid_n, STAGES: gl.constexpr, GROUP_M: gl.constexpr, HALF: gl.constexpr,
             WALK: gl.constexpr, OPT: gl.constexpr):
    """The loads of walk position ``tile``; returns it."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    pid_m, pid_n = _tile_mn(tile, used_m, num_pid_n, span_ptr, GROUP_M, WALK)
    e = gl.load(block_expert_ptr + pid_m)
    if HALF < 2:
        it = _load_tile(p, pid_m, pid_n, e, True, it, STAGES, HALF, OPT)
    else:
        it = _load_tile(p, pid_m, pid_n, e, gl.load(sorted_ids_ptr + pid_m * BM + HM) < num_pairs, it, STAGES,
                        HALF, OPT)
    return it


@gluon.jit
def _consumer0(p, sq, EPI: gl.constexpr, OPT: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
               HALF: gl.constexpr, trace_ptr, TRACE: gl.constexpr, WALK: gl.constexpr, SCHED: gl.constexpr):
    _consumer(p, sq, 0, EPI, OPT, STAGES, GROUP_M, HALF, trace_ptr, TRACE, WALK, SCHED)


@gluon.jit
def _consumer1(p, sq, EPI: gl.constexpr, OPT: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
               HALF: gl.constexpr, trace_ptr, TRACE: gl.constexpr, WALK: gl.constexpr, SCHED: gl.constexpr):
    _consumer(p, sq, 1, EPI, OPT, STAGES, GROUP_M, HALF, trace_ptr, False, WALK, SCHED)


@gluon.jit
def _consumer(p, sq, WG: gl.constexpr, EPI: gl.constexpr, OPT: gl.constexpr, STAGES: gl.constexpr,
              GROUP_M: gl.constexpr, HALF: gl.constexpr, trace_ptr, TRACE: gl.constexpr, WALK: gl.constexpr,
              SCHED: gl.constexpr):
    """4 warps, every tile of this CTA. Full tile: rows [WG * HM, (WG + 1) * HM), all BN columns. Half
    tile (rows 64-127 all padding): HALF 0 / 2 / 3: rows 0-63, weight block WG (the consumers split N, as
    in ``gluon_moe_gemm``; the gate_up row amax is exchanged through shared memory); HALF 1: warpgroup 0
    alone, as in a full tile, while warpgroup 1 only releases the stages. TRACE (warpgroup 0): per-tile
    start / end times into trace_ptr (``gluon_moe_trace``). SCHED 1: tiles from the producer
    (``gluon_moe_sched._receive``)."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    num_pid_n = gl.cdiv(N, BN)
    it = 0
    hcount = 0                                                              # half tiles seen (amax exchange phase)
    if SCHED == 0:
        for tile in range(gl.program_id(0), used_m * num_pid_n, gl.num_programs(0)):
            it, hcount = _consume(p, tile, it, hcount, num_pid_n, WG, EPI, OPT, STAGES, GROUP_M, HALF, trace_ptr, TRACE,
                                  WALK)
    else:
        tiles_smem, tfull, tempty, counter_ptr = sq
        k = 0
        tile = _receive(tiles_smem, tfull, tempty, k)
        while tile < used_m * num_pid_n:
            it, hcount = _consume(p, tile, it, hcount, num_pid_n, WG, EPI, OPT, STAGES, GROUP_M, HALF, trace_ptr, TRACE,
                                  WALK)
            k += 1
            tile = _receive(tiles_smem, tfull, tempty, k)


@gluon.jit
def _consume(p, tile, it, hcount, num_pid_n, WG: gl.constexpr, EPI: gl.constexpr, OPT: gl.constexpr,
             STAGES: gl.constexpr, GROUP_M: gl.constexpr, HALF: gl.constexpr, trace_ptr, TRACE: gl.constexpr,
             WALK: gl.constexpr):
    """One consumer's share of walk position ``tile`` (K loop + epilogue); returns (it, hcount)."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    pid_m, pid_n = _tile_mn(tile, used_m, num_pid_n, span_ptr, GROUP_M, WALK)
    e = gl.load(block_expert_ptr + pid_m)
    if TRACE:
        t0 = _now()
    full = gl.load(sorted_ids_ptr + pid_m * BM + HM) < num_pairs          # rows 64-127 hold a routed pair
    if full:
        it = _full_tile(p, pid_m, pid_n, e, it, WG, EPI, OPT, STAGES)
    elif HALF != 1:  # HALF 0, 2, 3: the consumers split N
        it, hcount = _half_tile(p, pid_m, pid_n, e, it, hcount, WG, EPI, OPT, STAGES)
    elif WG == 0:  # HALF 1: warpgroup 0 alone takes rows 0-63 and both weight blocks
        it = _full_tile(p, pid_m, pid_n, e, it, 0, EPI, OPT, STAGES)
    else:
        for kb in range(gl.cdiv(K, BK)):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            mbarrier.arrive(empty.index(s))
            it += 1
    if TRACE:
        _trace(trace_ptr, tile, t0, pid_m, full)
    return it, hcount


@gluon.jit
def moe_gemm_ws128_kernel(
    a_desc, sa_desc, b_desc, sb_desc, bias_ptr, c_ptr, cs_ptr,
    sorted_ids_ptr, block_expert_ptr, weights_ptr,
    num_blocks_m, N, K, num_pairs, num_kb,
    stride_biase, stride_cm, stride_cs,
    limit, alpha, trace_ptr, span_ptr, counter_ptr,
    EPI: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr, HALF: gl.constexpr = 0, TRACE: gl.constexpr = False,
    WALK: gl.constexpr = 0, SCHED: gl.constexpr = 0, OPT: gl.constexpr = 0,
):
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK], b_desc.layout)
    sa_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], sa_desc.layout)
    sb_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 8, 4], sb_desc.layout)  # 128 B: TMA alignment
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    xbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    amax_smem = gl.allocate_shared_memory(gl.float32, [4, HM], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # [slot * 2 + wg]
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)       # both consumer warpgroups release a stage
    for i in gl.static_range(2):
        mbarrier.init(xbar.index(i), count=2)        # half tiles: both consumers' row amax written
    fence_async_shared()
    used_m = _count_used_blocks(block_expert_ptr, num_blocks_m, 1024, num_warps)
    p = (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
         c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
         stride_cm, stride_cs, limit, alpha, span_ptr)
    if SCHED == 1:                                   # the tile ring of gluon_moe_sched
        zl: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        tiles_smem = gl.allocate_shared_memory(gl.int32, [2, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        for i in gl.static_range(2):
            tiles_smem.index(i).store(gl.zeros([32], gl.int32, zl))        # zeros: see gluon_moe_sched._receive
        tfull = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        tempty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(tfull.index(i), count=1)
            mbarrier.init(tempty.index(i), count=2)
        fence_async_shared()
        sq = (tiles_smem, tfull, tempty, counter_ptr)
    else:
        sq = (counter_ptr, counter_ptr, counter_ptr, counter_ptr)        # unused
    gl.warp_specialize([(_consumer0, (p, sq, EPI, OPT, STAGES, GROUP_M, HALF, trace_ptr, TRACE, WALK, SCHED)),
                        (_consumer1, (p, sq, EPI, OPT, STAGES, GROUP_M, HALF, trace_ptr, TRACE, WALK, SCHED)),
                        (_producer, (p, sq, EPI, OPT, STAGES, GROUP_M, HALF, WALK, SCHED))], [4, 1],
                       [CONSUMER_REGS, PRODUCER_REGS])
