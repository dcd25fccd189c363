"""Fold tile body of the 128-row Gluon MoE GEMM with folded tails (``gluon_moe_fold``; read its docstring):
one of an expert's full 128-row blocks and a TT-row slice of the expert's short last block in one tile, so
the slice shares the full block's W tile in shared memory instead of streaming the whole W tile again as a
half tile.

One consumer warpgroup WG per K step: the full block's rows [64 WG, 64 WG + 64) x both weight blocks exactly
as ``gluon_moe_tile128._k_loop`` (bitwise the same promotions), then the tail as a swapped product
D^T [WN, TT] = W block WG [WN, BK] @ A_tail^T [BK, TT] (wgmma M = the weight block's 128 columns, N = TT tail
rows: TT / 4 ... TT fp32 registers a thread instead of a 64-row accumulator), promoted with the tail rows'
A scales and the block's W scale. Epilogues: the full rows as ``_full_tile``; the tail transposed back to
[TT, WN] (through shared memory, ``convert_layout``), gate_up: SwiGLU + 1x128 quantization of h with the row
amax exchanged between the warpgroups (``_half_tile``'s exchange, same slots / phase counter); down:
``(+ b2) * routing weight`` scattered to pair order. Imported only with ``gluon_moe_fold`` (Gluon path
selected).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .gluon_moe_epi import _ex2_ftz, _pin, _rcp_ftz, _store_h, _store_y, _swiglu

BM = gl.constexpr(128)    # rows of a tile (= the align block)
HM = gl.constexpr(64)     # rows per consumer warpgroup
BK = gl.constexpr(128)    # K step (= one scale group)
WN = gl.constexpr(128)    # one weight block of columns
BN = gl.constexpr(256)    # 2 * WN
TS = gl.constexpr(32)     # tail A scales per stage (one 128-byte TMA box)
FP8_MAX = gl.constexpr(448.0)
SCALE_FLOOR = gl.constexpr(1e-10)


@gluon.jit
def _k_loop_fold(p, f, it, nk, j_sb, has1, WG: gl.constexpr, STAGES: gl.constexpr, TT: gl.constexpr,
                 mma: gl.constexpr, mmat: gl.constexpr):
    """acc0 / acc1 [HM, WN] as ``_k_loop`` and acct [WN, TT] (the tail's product with weight block WG,
    transposed; zeros when that block lies past N)."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    at_desc, sat_desc, at_bufs, sat_bufs, info_ptr = f
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    tcol: gl.constexpr = gl.SliceLayout(0, mmat)                               # tail rows = columns of D^T
    l4: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
    sa_v = sa_bufs._reinterpret(gl.float32, [STAGES, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    sat_v = sat_bufs._reinterpret(gl.float32, [STAGES, TS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    sb_v = sb_bufs._reinterpret(gl.float32, [STAGES, 32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    j4 = gl.arange(0, 4, l4)
    t_on = has1 or WG == 0                                                     # this warpgroup's block has columns
    acc0 = gl.zeros([HM, WN], gl.float32, mma)
    acc1 = gl.zeros([HM, WN], gl.float32, mma)
    acct = gl.zeros([WN, TT], gl.float32, mmat)
    for kb in range(nk):
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        a = a_bufs.index(s).slice(WG * HM, HM, dim=0)                          # [HM, BK]
        d = warpgroup_mma(a, b_bufs.index(s).slice(0, WN, dim=0).permute((1, 0)), gl.zeros([HM, WN], gl.float32, mma),
                          use_acc=False, is_async=True)
        sbv = sb_v.index(s).slice(0, 4).load(l4)
        sa = sa_v.index(s).slice(WG * HM, HM).load(rows)                         # [HM]
        r0 = sa * gl.sum(gl.where(j4 == j_sb, sbv, 0.0), axis=0)
        r1 = sa * gl.sum(gl.where(j4 == j_sb + 1, sbv, 0.0), axis=0)
        d = warpgroup_mma_wait(0, deps=(d, ))
        acc0 = _pin(acc0 + d * gl.expand_dims(r0, 1))
        if has1:
            d1 = warpgroup_mma(a, b_bufs.index(s).slice(WN, WN, dim=0).permute((1, 0)),
                               gl.zeros([HM, WN], gl.float32, mma), use_acc=False, is_async=True)
            d1 = warpgroup_mma_wait(0, deps=(d1, ))
            acc1 = _pin(acc1 + d1 * gl.expand_dims(r1, 1))                   # before the tail's wgmma
        if t_on:
            dt = warpgroup_mma(b_bufs.index(s).slice(WG * WN, WN, dim=0), at_bufs.index(s).permute((1, 0)),
                               gl.zeros([WN, TT], gl.float32, mmat), use_acc=False, is_async=True)
            rt = sat_v.index(s).slice(0, TT).load(tcol) * gl.sum(gl.where(j4 == j_sb + WG, sbv, 0.0), axis=0)
            dt = warpgroup_mma_wait(0, deps=(dt, ))
            acct += dt * gl.expand_dims(rt, 0)
        fence_async_shared()
        mbarrier.arrive(empty.index(s))
        it += 1
    return acc0, acc1, acct, it


@gluon.jit
def _main_epi(p, acc0, acc1, pid_m, pid_n, e, WG: gl.constexpr, EPI: gl.constexpr, OPT: gl.constexpr,
              mma: gl.constexpr):
    """The full block's rows [64 WG, 64 WG + 64): ``gluon_moe_tile128._full_tile``'s epilogue (the same code)."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    cols: gl.constexpr = gl.SliceLayout(0, mma)
    m0 = pid_m * BM + WG * HM
    n0 = pid_n * BN
    bias_e = bias_ptr + e.to(gl.int64) * stride_biase
    offs_n = n0 + gl.arange(0, WN, cols)
    n_ok0 = offs_n < N
    n_ok1 = offs_n + WN < N
    bias0 = gl.load(bias_e + offs_n, mask=n_ok0, other=0.0).to(gl.float32)
    bias1 = gl.load(bias_e + offs_n + WN, mask=n_ok1, other=0.0).to(gl.float32)
    if EPI == 1:
        h0 = _swiglu(acc0, bias0, n_ok0, limit, alpha, (OPT & 1) != 0)
        h1 = _swiglu(acc1, bias1, n_ok1, limit, alpha, (OPT & 1) != 0)
        amax = gl.maximum(gl.max(gl.abs(h0), axis=1), gl.max(gl.abs(h1), axis=1))
        st: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])
        sl: gl.constexpr = gl.SliceLayout(1, st)
        scale = gl.convert_layout(gl.maximum(amax, SCALE_FLOOR) / FP8_MAX, sl)
        om = m0 + gl.arange(0, HM, sl)
        row_ok = gl.load(sorted_ids_ptr + om) < num_pairs
        oh = n0 // 2 + gl.arange(0, WN // 2, gl.SliceLayout(0, st))
        _store_h(h0, scale, om, row_ok, oh, N, c_ptr, stride_cm, st, (OPT & 1) != 0)
        _store_h(h1, scale, om, row_ok, oh + WN // 2, N, c_ptr, stride_cm, st, (OPT & 1) != 0)
        gl.store(cs_ptr + pid_n * stride_cs + om, scale, mask=row_ok)
    else:
        st2: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        pair = gl.load(sorted_ids_ptr + m0 + gl.arange(0, HM, gl.SliceLayout(1, mma)))
        row_ok = pair < num_pairs
        w = gl.load(weights_ptr + gl.where(row_ok, pair, 0), mask=row_ok, other=0.0).to(gl.float32)
        prow = gl.convert_layout(pair, gl.SliceLayout(1, st2))
        on = n0 + gl.arange(0, WN, gl.SliceLayout(0, st2))
        _store_y(acc0, bias0, w, prow, on, N, num_pairs, c_ptr, stride_cm, st2)
        if n0 + WN < N:
            _store_y(acc1, bias1, w, prow, on + WN, N, num_pairs, c_ptr, stride_cm, st2)


@gluon.jit
def _tail_epi(p, acct, hcount, trow, pid_n, e, WG: gl.constexpr, EPI: gl.constexpr, OPT: gl.constexpr,
              TT: gl.constexpr, mmat: gl.constexpr):
    """The tail rows [trow, trow + TT) x weight block WG from acct [WN, TT]; returns hcount."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    m0 = trow
    n_w = pid_n * BN + WG * WN
    offs_n = n_w + gl.arange(0, WN, gl.SliceLayout(1, mmat))
    n_ok = offs_n < N
    bias = gl.load(bias_ptr + e.to(gl.int64) * stride_biase + offs_n, mask=n_ok, other=0.0).to(gl.float32)
    if EPI == 1:
        v = (acct + gl.expand_dims(bias, 1)).to(gl.bfloat16).to(gl.float32)
        v = gl.where(gl.expand_dims(n_ok, 1), v, 0.0)
        tl2: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [4, 1], [1, 0])     # gate / up pairs in a thread
        v = gl.convert_layout(gl.permute(v, (1, 0)), tl2)                          # [TT, WN]
        gate, up = gl.split(gl.reshape(v, [TT, WN // 2, 2]))
        gate = gl.minimum(gate, limit)
        up = gl.minimum(gl.maximum(up, -limit), limit)
        if (OPT & 1) != 0:   # as gluon_moe_epi._swiglu's FAST branch
            h = (up + 1.0) * (gate * _rcp_ftz(1.0 + _ex2_ftz((-alpha * gate) * 1.4426950408889634)))
        else:
            h = (up + 1.0) * (gate / (1.0 + gl.exp(-alpha * gate)))
        h = h.to(gl.bfloat16).to(gl.float32)                                       # [TT, WN // 2]
        xl: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        slot = hcount % 2
        amax_smem.index(slot * 2 + WG).slice(0, TT).store(gl.convert_layout(gl.max(gl.abs(h), axis=1), xl))
        mbarrier.arrive(xbar.index(slot))
        mbarrier.wait(xbar.index(slot), (hcount // 2) & 1)
        amax = gl.maximum(amax_smem.index(slot * 2).slice(0, TT).load(xl),
                          amax_smem.index(slot * 2 + 1).slice(0, TT).load(xl))
        st: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])          # [16 * k, 64]
        sl: gl.constexpr = gl.SliceLayout(1, st)
        scale = gl.convert_layout(gl.maximum(amax, SCALE_FLOOR) / FP8_MAX, sl)
        om = m0 + gl.arange(0, TT, sl)
        row_ok = gl.load(sorted_ids_ptr + om) < num_pairs
        oh = n_w // 2 + gl.arange(0, WN // 2, gl.SliceLayout(0, st))
        _store_h(h, scale, om, row_ok, oh, N, c_ptr, stride_cm, st, (OPT & 1) != 0)
        if WG == 0:
            gl.store(cs_ptr + pid_n * stride_cs + om, scale, mask=row_ok)
        hcount += 1
    elif n_w < N:
        pair = gl.load(sorted_ids_ptr + m0 + gl.arange(0, TT, gl.SliceLayout(0, mmat)))
        row_ok = pair < num_pairs
        w = gl.load(weights_ptr + gl.where(row_ok, pair, 0), mask=row_ok, other=0.0).to(gl.float32)
        out = (acct + gl.expand_dims(bias, 1)) * gl.expand_dims(w, 0)                # [WN, TT], as _store_y
        st2: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        out = gl.convert_layout(gl.permute(out.to(c_ptr.dtype.element_ty), (1, 0)), st2)   # [TT, WN]
        prow = gl.convert_layout(pair, gl.SliceLayout(1, st2))
        on = n_w + gl.arange(0, WN, gl.SliceLayout(0, st2))
        ok = gl.expand_dims(prow < num_pairs, 1) & gl.expand_dims(on < N, 0)
        gl.store(c_ptr + gl.expand_dims(prow.to(gl.int64) * stride_cm, 1) + gl.expand_dims(on, 0), out, mask=ok)
    return hcount


@gluon.jit
def _fold_tile(p, f, pid_m, pid_n, e, trow, it, hcount, WG: gl.constexpr, EPI: gl.constexpr, OPT: gl.constexpr,
               STAGES: gl.constexpr, TT: gl.constexpr):
    """One consumer's share of a fold tile (K loop, tail epilogue, full rows' epilogue); returns (it, hcount)."""
    (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, xbar, amax_smem, bias_ptr,
     c_ptr, cs_ptr, sorted_ids_ptr, block_expert_ptr, weights_ptr, used_m, N, K, num_pairs, num_kb, stride_biase,
     stride_cm, stride_cs, limit, alpha, span_ptr) = p
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, WN, 32])
    mmat: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TT, 32])
    n0 = pid_n * BN
    acc0, acc1, acct, it = _k_loop_fold(p, f, it, gl.cdiv(K, BK), (n0 // 128) % 4, n0 + WN < N, WG, STAGES, TT, mma,
                                        mmat)
    _main_epi(p, acc0, acc1, pid_m, pid_n, e, WG, EPI, OPT, mma)
    hcount = _tail_epi(p, acct, hcount, trow, pid_n, e, WG, EPI, OPT, TT, mmat)
    return it, hcount
