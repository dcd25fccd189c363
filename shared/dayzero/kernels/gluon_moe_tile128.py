"""Tile bodies of the 128-row Gluon MoE GEMM (``gluon_moe_gemm128``; read its docstring): one consumer
warpgroup's K loops (full tile: both weight blocks of its 64 rows; half tile: one weight block of rows
0-63) and the full / half tile K loop + epilogue. Imported only with ``gluon_moe_gemm128`` (Gluon path
selected).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .gluon_moe_epi import _pin, _store_h, _store_hs, _store_y, _swiglu

BM = gl.constexpr(128)    # rows of a tile (= the align block)
HM = gl.constexpr(64)     # rows per consumer warpgroup
BK = gl.constexpr(128)    # K step (= one scale group)
WN = gl.constexpr(128)    # one weight block of columns
BN = gl.constexpr(256)    # 2 * WN
FP8_MAX = gl.constexpr(448.0)
SCALE_FLOOR = gl.constexpr(1e-10)


@gluon.jit
def _k_loop(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, it, nk, j_sb, has1, WG: gl.constexpr,
            STAGES: gl.constexpr, mma: gl.constexpr):
    """One tile's K loop of one consumer: acc0 / acc1 [HM, WN] fp32 (the tile's two weight blocks) =
    sum over K steps of (wgmma 64x128x128) * sa[row] * sb[block]; acc1 only when ``has1``."""
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    l4: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])                 # every thread holds the 4 scales
    sa_v = sa_bufs._reinterpret(gl.float32, [STAGES, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    sb_v = sb_bufs._reinterpret(gl.float32, [STAGES, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    j4 = gl.arange(0, 4, l4)
    acc0 = gl.zeros([HM, WN], gl.float32, mma)
    acc1 = gl.zeros([HM, WN], gl.float32, mma)
    for kb in range(nk):
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        a = a_bufs.index(s).slice(WG * HM, HM, dim=0)                      # [HM, BK]
        d = warpgroup_mma(a, b_bufs.index(s).slice(0, WN, dim=0).permute((1, 0)), gl.zeros([HM, WN], gl.float32, mma),
                          use_acc=False, is_async=True)
        sbv = sb_v.index(s).slice(0, 4).load(l4)
        sa = sa_v.index(s).slice(WG * HM, HM).load(rows)                     # [HM]
        r0 = sa * gl.sum(gl.where(j4 == j_sb, sbv, 0.0), axis=0)
        r1 = sa * gl.sum(gl.where(j4 == j_sb + 1, sbv, 0.0), axis=0)
        d = warpgroup_mma_wait(0, deps=(d, ))
        acc0 = _pin(acc0 + d * gl.expand_dims(r0, 1))                      # promoted before the next wgmma
        if has1:
            d1 = warpgroup_mma(a, b_bufs.index(s).slice(WN, WN, dim=0).permute((1, 0)),
                               gl.zeros([HM, WN], gl.float32, mma), use_acc=False, is_async=True)
            d1 = warpgroup_mma_wait(0, deps=(d1, ))
            acc1 += d1 * gl.expand_dims(r1, 1)
        fence_async_shared()                                                  # our reads before the next TMA
        mbarrier.arrive(empty.index(s))                                       # both consumers -> refill
        it += 1
    return acc0, acc1, it


@gluon.jit
def _k_loop1(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, it, nk, j_sb, WG: gl.constexpr, STAGES: gl.constexpr,
             mma: gl.constexpr):
    """Half tile (rows 0-63 only): this consumer's weight block WG, acc [HM, WN] = sum over K steps of
    (wgmma 64x128x128) * sa[row] * sb (``gluon_moe_gemm``'s loop)."""
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    l4: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
    sa_v = sa_bufs._reinterpret(gl.float32, [STAGES, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    sb_v = sb_bufs._reinterpret(gl.float32, [STAGES, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    pick = gl.arange(0, 4, l4) == j_sb
    acc = gl.zeros([HM, WN], gl.float32, mma)
    for kb in range(nk):
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        d = warpgroup_mma(a_bufs.index(s).slice(0, HM, dim=0),
                          b_bufs.index(s).slice(WG * WN, WN, dim=0).permute((1, 0)),  # [BK, WN], K-major
                          gl.zeros([HM, WN], gl.float32, mma), use_acc=False, is_async=True)
        r = sa_v.index(s).slice(0, HM).load(rows) * gl.sum(gl.where(pick, sb_v.index(s).slice(0, 4).load(l4), 0.0),
                                                            axis=0)
        d = warpgroup_mma_wait(0, deps=(d, ))
        fence_async_shared()
        mbarrier.arrive(empty.index(s))
        acc += d * gl.expand_dims(r, 1)
        it += 1
    return acc, it


@gluon.jit
def _full_tile(p, pid_m, pid_n, e, it, WG: gl.constexpr, EPI: gl.constexpr, OPT: gl.constexpr, STAGES: gl.constexpr):
    """Rows [WG * HM, (WG + 1) * HM) of the tile, both weight blocks: K loop + epilogue; returns it."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, WN, 32])
    cols: gl.constexpr = gl.SliceLayout(0, mma)
    m0 = pid_m * BM + WG * HM
    n0 = pid_n * BN
    has1 = n0 + WN < N                                                      # the second weight block has columns
    acc0, acc1, it = _k_loop(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, it, gl.cdiv(K, BK), (n0 // 128) % 4,
                             has1, WG, STAGES, mma)
    bias_e = bias_ptr + e.to(gl.int64) * stride_biase
    offs_n = n0 + gl.arange(0, WN, cols)
    n_ok0 = offs_n < N
    n_ok1 = offs_n + WN < N
    bias0 = gl.load(bias_e + offs_n, mask=n_ok0, other=0.0).to(gl.float32)
    bias1 = gl.load(bias_e + offs_n + WN, mask=n_ok1, other=0.0).to(gl.float32)
    if EPI == 1:
        h0 = _swiglu(acc0, bias0, n_ok0, limit, alpha, (OPT & 1) != 0)                             # [HM, WN // 2]
        h1 = _swiglu(acc1, bias1, n_ok1, limit, alpha, (OPT & 1) != 0)
        amax = gl.maximum(gl.max(gl.abs(h0), axis=1), gl.max(gl.abs(h1), axis=1))
        st: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])
        sl: gl.constexpr = gl.SliceLayout(1, st)
        scale = gl.convert_layout(gl.maximum(amax, SCALE_FLOOR) / FP8_MAX, sl)
        om = m0 + gl.arange(0, HM, sl)
        row_ok = gl.load(sorted_ids_ptr + om) < num_pairs
        oh = n0 // 2 + gl.arange(0, WN // 2, gl.SliceLayout(0, st))
        _store_h(h0, scale, om, row_ok, oh, N, c_ptr, stride_cm, st, (OPT & 1) != 0, (OPT & 4) != 0)
        _store_h(h1, scale, om, row_ok, oh + WN // 2, N, c_ptr, stride_cm, st, (OPT & 1) != 0, (OPT & 4) != 0)
        if (OPT & 4) != 0:
            _store_hs(cs_ptr + pid_n * stride_cs, scale, om, row_ok)
        else:
            gl.store(cs_ptr + pid_n * stride_cs + om, scale, mask=row_ok)
    else:
        st2: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        pair = gl.load(sorted_ids_ptr + m0 + gl.arange(0, HM, gl.SliceLayout(1, mma)))  # num_pairs = padding row
        row_ok = pair < num_pairs
        w = gl.load(weights_ptr + gl.where(row_ok, pair, 0), mask=row_ok, other=0.0).to(gl.float32)
        prow = gl.convert_layout(pair, gl.SliceLayout(1, st2))
        on = n0 + gl.arange(0, WN, gl.SliceLayout(0, st2))
        _store_y(acc0, bias0, w, prow, on, N, num_pairs, c_ptr, stride_cm, st2)
        if has1:
            _store_y(acc1, bias1, w, prow, on + WN, N, num_pairs, c_ptr, stride_cm, st2)
    return it


@gluon.jit
def _half_tile(p, pid_m, pid_n, e, it, hcount, WG: gl.constexpr, EPI: gl.constexpr, OPT: gl.constexpr,
               STAGES: gl.constexpr):
    """Rows 0-63 of the tile, weight block WG (the other consumer has the other block): K loop +
    epilogue; returns (it, hcount)."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, WN, 32])
    nk = gl.cdiv(K, BK)
    m0 = pid_m * BM
    n_w = pid_n * BN + WG * WN
    if n_w < N:
        acc, it = _k_loop1(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, it, nk, (n_w // 128) % 4, WG, STAGES, mma)
    else:  # this weight block lies past N (last tile): only release the stages
        for kb in range(nk):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            mbarrier.arrive(empty.index(s))
            it += 1
        acc = gl.zeros([HM, WN], gl.float32, mma)
    offs_n = n_w + gl.arange(0, WN, gl.SliceLayout(0, mma))
    n_ok = offs_n < N
    bias = gl.load(bias_ptr + e.to(gl.int64) * stride_biase + offs_n, mask=n_ok, other=0.0).to(gl.float32)
    if EPI == 1:
        h = _swiglu(acc, bias, n_ok, limit, alpha, (OPT & 1) != 0)                                 # [HM, WN // 2]
        xl: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        slot = hcount % 2
        amax_smem.index(slot * 2 + WG).store(gl.convert_layout(gl.max(gl.abs(h), axis=1), xl))
        mbarrier.arrive(xbar.index(slot))
        mbarrier.wait(xbar.index(slot), (hcount // 2) & 1)
        amax = gl.maximum(amax_smem.index(slot * 2).load(xl), amax_smem.index(slot * 2 + 1).load(xl))
        st: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])
        sl: gl.constexpr = gl.SliceLayout(1, st)
        scale = gl.convert_layout(gl.maximum(amax, SCALE_FLOOR) / FP8_MAX, sl)
        om = m0 + gl.arange(0, HM, sl)
        row_ok = gl.load(sorted_ids_ptr + om) < num_pairs
        oh = n_w // 2 + gl.arange(0, WN // 2, gl.SliceLayout(0, st))
        _store_h(h, scale, om, row_ok, oh, N, c_ptr, stride_cm, st, (OPT & 1) != 0, (OPT & 4) != 0)
        if WG == 0:
            if (OPT & 4) != 0:
                _store_hs(cs_ptr + pid_n * stride_cs, scale, om, row_ok)
            else:
                gl.store(cs_ptr + pid_n * stride_cs + om, scale, mask=row_ok)
        hcount += 1
    else:
        st2: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        pair = gl.load(sorted_ids_ptr + m0 + gl.arange(0, HM, gl.SliceLayout(1, mma)))
        row_ok = pair < num_pairs
        w = gl.load(weights_ptr + gl.where(row_ok, pair, 0), mask=row_ok, other=0.0).to(gl.float32)
        prow = gl.convert_layout(pair, gl.SliceLayout(1, st2))
        on = n_w + gl.arange(0, WN, gl.SliceLayout(0, st2))
        _store_y(acc, bias, w, prow, on, N, num_pairs, c_ptr, stride_cm, st2)
    return it, hcount
