"""128-row Gluon MoE GEMM with folded tails (``GluonConfig.fold``, opt-in ``BM128_FOLD16``; Hopper): the kernel
of ``gluon_moe_gemm128`` (read its docstring) plus two tile kinds.

Random routing leaves most experts a short tail: at 8192 tokens x top-4 over 128 experts an expert gets
256 +- 16 rows, so half of them end in a block of a few real rows. ``BM128`` runs such a block as a half tile
that streams the expert's whole W tile again (32 KB a K step) for those rows (bench/NOTES.md, "Gluon run 10").
Here an expert whose last block t holds r <= min(TT * F, fold_max) rows (F = its blocks before t, TT = 16) has
block t *absorbed* (every partition skips it) and its j-th block, a full one, becomes a *fold* tile that also
computes the tail rows [TT j, TT j + TT) of block t: per K step the producer loads A [128, 128] + the tail
A [TT, 128] (+ its scales) + W once, and each consumer adds a swapped wgmma W block [128, 128] x A_tail^T
[128, TT] (``gluon_moe_tile_fold``). The kinds come from ``gluon_moe_fold_info`` (one Triton launch after
align: info[b] = kind + 4 * the tail slice's first row), read with the block's expert id; everything else
is as ``gluon_moe_gemm128`` with HALF 0 (kind 0 full tile, kind 3 half tile: the consumers split N).
Rows of the full blocks are computed by the same instructions as ``BM128``'s (bitwise the same); the tail
rows by the swapped product (same products and promotions; the tensor core's in-instruction sum order may
differ). Imported only by ``gluon_moe_gemm_run`` when a fold configuration runs (Gluon path selected).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .gluon_moe_gemm import _count_used_blocks, _tile_mn
from .gluon_moe_gemm128 import _load_tile
from .gluon_moe_sched import _next, _publish, _receive
from .gluon_moe_tile128 import _full_tile, _half_tile
from .gluon_moe_tile_fold import _fold_tile

BM = gl.constexpr(128)    # rows of a tile (= the align block)
HM = gl.constexpr(64)     # rows per consumer warpgroup
BK = gl.constexpr(128)    # K step (= one scale group)
WN = gl.constexpr(128)    # one weight block of columns
BN = gl.constexpr(256)    # two 128-wide weight blocks
TS = gl.constexpr(32)     # tail A scales per stage (one 128-byte TMA box)


@gluon.jit
def _kind(p, f, pid_m):
    """(expert, kind, tail row) of M block pid_m from ``gluon_moe_fold_info``: kind 0 = full tile, 1 = fold
    (also the tail rows [tail row, + TT) of the expert's last block), 2 = absorbed (nothing to do), 3 = half
    tile (as BM128 with HALF 0)."""
    e = gl.load(p[16] + pid_m)
    info = gl.load(f[4] + pid_m)
    return e, info & 3, info >> 2


@gluon.jit
def _load_fold(p, f, pid_m, pid_n, e, trow, it, STAGES: gl.constexpr, OPT: gl.constexpr, TT: gl.constexpr):
    """The TMA loads of a fold tile's K steps: ``_load_tile``'s (full tile; OPT & 2: W per weight block)
    plus the tail A rows [trow, trow + TT) and their scales; returns it."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    at_desc, sat_desc, at_bufs, sat_bufs, info_ptr = f
    row_b = e * N + pid_n * BN
    col_sb = (pid_n * (BN // 128)) // 4 * 4
    has1 = pid_n * BN + WN < N
    for kb in range(gl.cdiv(K, BK)):
        s = it % STAGES
        bar = ready.index(s)
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        base: gl.constexpr = BM * BK + TT * BK + BM * 4 + TS * 4 + 8 * 16
        if (OPT & 2) != 0:
            mbarrier.expect(bar, base + BN * BK, pred=has1)
            mbarrier.expect(bar, base + WN * BK, pred=not has1)
            tma.async_copy_global_to_shared(b_desc, [row_b, kb * BK], bar, b_bufs.index(s).slice(0, WN))
            tma.async_copy_global_to_shared(b_desc, [row_b + WN, kb * BK], bar, b_bufs.index(s).slice(WN, WN),
                                            pred=has1)
        else:
            mbarrier.expect(bar, base + BN * BK)
            tma.async_copy_global_to_shared(b_desc, [row_b, kb * BK], bar, b_bufs.index(s))
        tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kb * BK], bar, a_bufs.index(s))
        tma.async_copy_global_to_shared(at_desc, [trow, kb * BK], bar, at_bufs.index(s))
        tma.async_copy_global_to_shared(sa_desc, [kb, pid_m * BM], bar, sa_bufs.index(s))
        tma.async_copy_global_to_shared(sat_desc, [kb, trow], bar, sat_bufs.index(s))
        tma.async_copy_global_to_shared(sb_desc, [e * num_kb + kb, col_sb], bar, sb_bufs.index(s))
        it += 1
    return it


@gluon.jit
def _produce(p, f, tile, it, num_pid_n, STAGES: gl.constexpr, GROUP_M: gl.constexpr, WALK: gl.constexpr,
             OPT: gl.constexpr, TT: gl.constexpr):
    pid_m, pid_n = _tile_mn(tile, p[18], num_pid_n, p[28], GROUP_M, WALK)
    e, kind, trow = _kind(p, f, pid_m)
    if kind == 1:
        it = _load_fold(p, f, pid_m, pid_n, e, trow, it, STAGES, OPT, TT)
    elif kind != 2:
        it = _load_tile(p, pid_m, pid_n, e, True, it, STAGES, 0, OPT)
    return it


@gluon.jit
def _producer(p, f, sq, OPT: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, WALK: gl.constexpr,
              SCHED: gl.constexpr, TT: gl.constexpr):
    """1 warp: the loads of every tile of this CTA (``gluon_moe_gemm128._producer`` with the fold kinds)."""
    used_m = p[18]
    N = p[19]
    num_pid_n = gl.cdiv(N, BN)
    it = 0
    if SCHED == 0:
        for tile in range(gl.program_id(0), used_m * num_pid_n, gl.num_programs(0)):
            it = _produce(p, f, tile, it, num_pid_n, STAGES, GROUP_M, WALK, OPT, TT)
    else:
        tiles_smem, tfull, tempty, counter_ptr = sq
        tile = gl.program_id(0)
        k = 0
        while tile < used_m * num_pid_n:
            _publish(tiles_smem, tfull, tempty, k, tile)
            it = _produce(p, f, tile, it, num_pid_n, STAGES, GROUP_M, WALK, OPT, TT)
            k += 1
            tile = _next(counter_ptr)
        _publish(tiles_smem, tfull, tempty, k, used_m * num_pid_n)          # the end


@gluon.jit
def _consume(p, f, tile, it, hcount, num_pid_n, WG: gl.constexpr, EPI: gl.constexpr, OPT: gl.constexpr,
             STAGES: gl.constexpr, GROUP_M: gl.constexpr, WALK: gl.constexpr, TT: gl.constexpr):
    """One consumer's share of walk position ``tile``; returns (it, hcount)."""
    pid_m, pid_n = _tile_mn(tile, p[18], num_pid_n, p[28], GROUP_M, WALK)
    e, kind, trow = _kind(p, f, pid_m)
    if kind == 1:
        it, hcount = _fold_tile(p, f, pid_m, pid_n, e, trow, it, hcount, WG, EPI, OPT, STAGES, TT)
    elif kind == 0:
        it = _full_tile(p, pid_m, pid_n, e, it, WG, EPI, OPT, STAGES)
    elif kind == 3:                                                          # rows 64-127 all padding
        it, hcount = _half_tile(p, pid_m, pid_n, e, it, hcount, WG, EPI, OPT, STAGES)
    return it, hcount


@gluon.jit
def _consumer(p, f, sq, WG: gl.constexpr, EPI: gl.constexpr, OPT: gl.constexpr, STAGES: gl.constexpr,
              GROUP_M: gl.constexpr, WALK: gl.constexpr, SCHED: gl.constexpr, TT: gl.constexpr):
    """4 warps, every tile of this CTA (``gluon_moe_gemm128._consumer`` with the fold kinds)."""
    used_m = p[18]
    num_pid_n = gl.cdiv(p[19], BN)
    it = 0
    hcount = 0                                                              # amax exchanges (half and fold tiles)
    if SCHED == 0:
        for tile in range(gl.program_id(0), used_m * num_pid_n, gl.num_programs(0)):
            it, hcount = _consume(p, f, tile, it, hcount, num_pid_n, WG, EPI, OPT, STAGES, GROUP_M, WALK, TT)
    else:
        tiles_smem, tfull, tempty, counter_ptr = sq
        k = 0
        tile = _receive(tiles_smem, tfull, tempty, k)
        while tile < used_m * num_pid_n:
            it, hcount = _consume(p, f, tile, it, hcount, num_pid_n, WG, EPI, OPT, STAGES, GROUP_M, WALK, TT)
            k += 1
            tile = _receive(tiles_smem, tfull, tempty, k)


@gluon.jit
def _consumer0(p, f, sq, EPI: gl.constexpr, OPT: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
               WALK: gl.constexpr, SCHED: gl.constexpr, TT: gl.constexpr):
    _consumer(p, f, sq, 0, EPI, OPT, STAGES, GROUP_M, WALK, SCHED, TT)


@gluon.jit
def _consumer1(p, f, sq, EPI: gl.constexpr, OPT: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
               WALK: gl.constexpr, SCHED: gl.constexpr, TT: gl.constexpr):
    _consumer(p, f, sq, 1, EPI, OPT, STAGES, GROUP_M, WALK, SCHED, TT)


@gluon.jit
def moe_gemm_fold_kernel(
    a_desc, sa_desc, b_desc, sb_desc, at_desc, sat_desc, bias_ptr, c_ptr, cs_ptr,
    sorted_ids_ptr, block_expert_ptr, weights_ptr,
    num_blocks_m, N, K, num_pairs, num_kb,
    stride_biase, stride_cm, stride_cs,
    limit, alpha, span_ptr, counter_ptr, info_ptr,
    EPI: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr, TT: gl.constexpr = 16,
    WALK: gl.constexpr = 0, SCHED: gl.constexpr = 0, OPT: gl.constexpr = 0,
):
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK], b_desc.layout)
    sa_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], sa_desc.layout)
    sb_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 8, 4], sb_desc.layout)
    at_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, TT, BK], at_desc.layout)
    sat_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, TS], sat_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    xbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    amax_smem = gl.allocate_shared_memory(gl.float32, [4, HM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(xbar.index(i), count=2)
    fence_async_shared()
    used_m = _count_used_blocks(block_expert_ptr, num_blocks_m, 1024, num_warps)
    p = (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
         c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
         stride_cm, stride_cs, limit, alpha, span_ptr)
    f = (at_desc, sat_desc, at_bufs, sat_bufs, info_ptr)
    if SCHED == 1:                                   # the tile ring of gluon_moe_sched
        zl: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        tiles_smem = gl.allocate_shared_memory(gl.int32, [2, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        for i in gl.static_range(2):
            tiles_smem.index(i).store(gl.zeros([32], gl.int32, zl))
        tfull = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        tempty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(tfull.index(i), count=1)
            mbarrier.init(tempty.index(i), count=2)
        fence_async_shared()
        sq = (tiles_smem, tfull, tempty, counter_ptr)
    else:
        sq = (counter_ptr, counter_ptr, counter_ptr, counter_ptr)        # unused
    gl.warp_specialize([(_consumer0, (p, f, sq, EPI, OPT, STAGES, GROUP_M, WALK, SCHED, TT)),
                        (_consumer1, (p, f, sq, EPI, OPT, STAGES, GROUP_M, WALK, SCHED, TT)),
                        (_producer, (p, f, sq, OPT, STAGES, GROUP_M, WALK, SCHED, TT))], [4, 1],
                       [CONSUMER_REGS, PRODUCER_REGS])
