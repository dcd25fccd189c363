"""Decode MoE at T = 1 in one persistent Gluon launch (``SplitTiles.stream``, Hopper): gate_up and down as one
stream of FP8 weight tiles per CTA, whose reads never wait for h.

Why (bench/NOTES.md "Session 11"): the two wg launches of T = 1 take ~35 us for 99.5 MB; two launches that only
read those bytes take 30.5 us, one launch 26.5-27. One cooperative launch of the same tiles (``wgf``, session 10)
tied: its down items started only when the slowest gate_up item of their h ended, and their weight reads waited
with them. Here each CTA (one per SM, all resident: cooperative launch) walks its own sequence of [64, 128] FP8
weight tiles through a TMA ring STAGES tiles deep (~175 KB); only the [8, 128] h operand of a down step waits.

Work: gate_up of local pair q is a stream of W1 = ceil(2I / 64) * KS steps (N tile n, K step k: step n * KS + k),
down one of W2 = ceil(H / 64) * KS. CTA c of G takes steps [c W / G, (c + 1) W / G) of each stream: one segment
per (stage, pair). ORDER 0 walks gu(0), gu(1), dn(0), gu(2), dn(1), ..., gu(L - 1), dn(L - 2), dn(L - 1): a down
segment comes one gate_up segment after the one it needs, so its h is usually complete when the CTA gets there;
ORDER 1: every gate_up segment, then every down one.
Per step: wgmma 64 x 8 x 128, A = the weight tile, B = [8, 128] K-major with row 0 = hi, row 1 = lo (gate_up: the
token, e4m3(x / s) and e4m3((x / s - hi) * 16), s = max |x| / 448; down: the e4m3 hi / lo rows of h that gate_up
wrote with the fixed scale hs of ``triton_moe_small_wg``), rows 2-7 zero; acc [64, 8] += result * block scale.
A tile's partial (its steps in this CTA) goes to a scratch slot (part = this CTA's rank among the CTAs holding
the tile's steps); a ticket per tile picks the last arrival, which sums the parts in part order (bitwise
repeatable) and finishes the tile. gate_up: + b1, bf16, clamped SwiGLU, h as e4m3 hi / lo, then +1 on pair j's
count of finished tiles (release). down (one ticket per N tile over all local pairs): out = sum over local pairs
in pair order of w_j * (sum of parts + b2[e_j]). A down chunk (SEGP steps of a segment) first waits for its
pair's count (acquire), then loads its h rows into shared memory.
The plan (per step: kind, pair, stage step, part, TMA row, block scale) is built once per CTA in shared memory.
Tickets are reset by their last users, the pair counts by the last CTA to finish: no memset per call; calls on
the same experts must not run concurrently. No host syncs (CUDA-graph capturable). Routes to experts outside
[offset, offset + E) are skipped; no local route: out = 0.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

BN = gl.constexpr(64)      # weight rows per tile (wgmma M)
BK = gl.constexpr(128)     # K step (= one scale block)
FP8_MAX = gl.constexpr(448.0)
# plan fields (int32 [NS, 8] in shared memory)
F_FLAGS = gl.constexpr(0)  # kind (0 gate_up, 1 down) | tile ends here << 1 | segment length << 2
F_PAIR = gl.constexpr(1)   # global pair j
F_POS = gl.constexpr(2)    # position in the segment
F_STEP = gl.constexpr(3)   # step in the stage stream (n * KS + k)
F_PART = gl.constexpr(4)
F_PARTS = gl.constexpr(5)
F_ROW = gl.constexpr(6)    # TMA row: e * N + n * 64
F_SCALE = gl.constexpr(7)  # block scale (fp32 bits)


@gluon.jit
def _clk(TRACE: gl.constexpr, NS_: gl.constexpr = False):
    """TRACE: %clock64 (cycles) or, with NS_, %globaltimer (ns); else 0."""
    if TRACE:
        if NS_:
            v = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                          pack=1)
        else:
            v = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    else:
        v = 0
    return v


@gluon.jit
def _cta_of(s, W, G):
    """The CTA holding step s of a stream of W steps cut into [c W / G, (c + 1) W / G)."""
    return ((s + 1) * G + W - 1) // W - 1


@gluon.jit
def _seg(i, L, ORDER: gl.constexpr):
    """Segment i of a CTA's walk -> (kind, local pair q)."""
    if ORDER == 0:
        kind = gl.where((i == 0) | ((i % 2 == 1) & (i != 2 * L - 1)), 0, 1)
        q = gl.where(i == 2 * L - 1, L - 1, gl.where(i % 2 == 1, (i + 1) // 2, gl.maximum(i // 2 - 1, 0)))
    else:
        kind = gl.where(i < L, 0, 1)
        q = gl.where(i < L, i, i - L)
    return kind, q


@gluon.jit
def _field(row, f: gl.constexpr, l8: gl.constexpr):
    """Field f of a plan row [1, 8] (every thread holds the row) as a scalar."""
    c = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, l8)), 0)
    return gl.sum(gl.sum(gl.where(c == f, row, 0), axis=1), axis=0)


@gluon.jit
def _pairs(ids_ptr, P, offset, E, PB: gl.constexpr, num_warps: gl.constexpr):
    """(L local pairs, jq [PB]: the global pair of local index q, ev [PB]: the local expert of pair p)."""
    lp: gl.constexpr = gl.BlockedLayout([PB], [32], [num_warps], [0])
    pq = gl.arange(0, PB, lp)
    ev = gl.load(ids_ptr + pq, mask=pq < P, other=-1).to(gl.int32) - offset
    loc = (pq < P) & (ev >= 0) & (ev < E)
    jq = gl.zeros([PB], gl.int32, lp)
    L = 0
    for p in range(P):
        is_loc = gl.sum(gl.where((pq == p) & loc, 1, 0), axis=0)
        jq = gl.where((pq == L) & (is_loc > 0), p, jq)
        L += is_loc
    return L, jq, ev


@gluon.jit
def _plan(L, jq, ev, c, G, NT1, NT2, N1, N2, KS: gl.constexpr, NS: gl.constexpr, PB: gl.constexpr,
          ORDER: gl.constexpr, num_warps: gl.constexpr):
    """This CTA's walk as int32 [NS, 8] (fields F_*; F_SCALE still 0) and its length."""
    l2: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [num_warps, 1], [1, 0])
    lp: gl.constexpr = gl.BlockedLayout([PB], [32], [num_warps], [0])
    pq = gl.arange(0, PB, lp)
    g = gl.arange(0, NS, gl.SliceLayout(1, l2))
    kind = gl.zeros([NS], gl.int32, gl.SliceLayout(1, l2))
    j = kind
    pos = kind
    s = kind
    seglen = kind
    W = kind
    row0 = kind
    start = 0
    for i in range(2 * L):
        kd, q = _seg(i, L, ORDER)
        Wi = gl.where(kd == 0, NT1 * KS, NT2 * KS)
        lo = c * Wi // G
        n = (c + 1) * Wi // G - lo
        jj = gl.sum(gl.where(pq == q, jq, 0), axis=0)
        e = gl.sum(gl.where(pq == jj, ev, 0), axis=0)
        m = (g >= start) & (g < start + n)
        kind = gl.where(m, kd, kind)
        j = gl.where(m, jj, j)
        pos = gl.where(m, g - start, pos)
        s = gl.where(m, lo + g - start, s)
        seglen = gl.where(m, n, seglen)
        W = gl.where(m, Wi, W)
        row0 = gl.where(m, e * gl.where(kd == 0, N1, N2), row0)
        start += n
    tile = s // KS
    first = _cta_of(tile * KS, W, G)
    end = ((s % KS) == KS - 1) | (pos == seglen - 1)
    cols = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, l2)), 0)
    vals = (kind + end.to(gl.int32) * 2 + seglen * 4, j, pos, s, c - first,
            _cta_of(tile * KS + KS - 1, W, G) - first + 1, row0 + tile * BN)
    info = gl.zeros([NS, 8], gl.int32, l2)
    for f in gl.static_range(7):
        info = gl.where(cols == f, gl.expand_dims(vals[f], 1), info)
    return info, start


@gluon.jit
def _scales(info, s1_ptr, s2_ptr, stride_se1, stride_sn1, stride_se2, stride_sn2, N1, N2, KS: gl.constexpr,
            num_warps: gl.constexpr):
    """info with F_SCALE filled: the weight block scale of each step ((e, row block, k) of its stage's scales)."""
    l2: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [num_warps, 1], [1, 0])
    cols = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, l2)), 0)
    kind = gl.sum(gl.where(cols == F_FLAGS, info, 0), axis=1) & 1
    s = gl.sum(gl.where(cols == F_STEP, info, 0), axis=1)
    row = gl.sum(gl.where(cols == F_ROW, info, 0), axis=1)
    k = s % KS
    e1 = row // N1
    e2 = row // N2
    sc1 = gl.load(s1_ptr + e1.to(gl.int64) * stride_se1 + ((row - e1 * N1) // 128) * stride_sn1 + k,
                  mask=kind == 0, other=0.0)
    sc2 = gl.load(s2_ptr + e2.to(gl.int64) * stride_se2 + ((row - e2 * N2) // 128) * stride_sn2 + k,
                  mask=kind == 1, other=0.0)
    bits = (sc1 + sc2).to(gl.int32, bitcast=True)
    return gl.where(cols == F_SCALE, gl.expand_dims(bits, 1), info)


@gluon.jit
def _token(bx, x_ptr, H, KSC: gl.constexpr, HP: gl.constexpr, num_warps: gl.constexpr):
    """B of the gate_up steps: bx [KSC * 64, 128] e4m3 (8 rows a step), step k's rows 0 / 1 = hi / lo of x[k * 128 : + 128] / s;
    returns s = max |x| / 448."""
    lx: gl.constexpr = gl.BlockedLayout([HP // (32 * num_warps)], [32], [num_warps], [0])
    ox = gl.arange(0, HP, lx)
    s = gl.maximum(gl.max(gl.abs(gl.load(x_ptr + ox, mask=ox < H, other=0.0).to(gl.float32)), axis=0), 1e-30) / FP8_MAX
    lb: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    r = gl.expand_dims(gl.arange(0, 64, gl.SliceLayout(1, lb)), 1)                # 8 steps x 8 rows
    cc = gl.expand_dims(gl.arange(0, 128, gl.SliceLayout(0, lb)), 0)
    bl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    for ch in gl.static_range(KSC):
        kx = (ch * 8 + r // 8) * 128 + cc
        v = gl.load(x_ptr + kx, mask=((r % 8) < 2) & (kx < H), other=0.0).to(gl.float32) / s
        hi = v.to(gl.float8e4nv).to(gl.float32)
        b = gl.where((r % 8) == 0, hi, (v - hi) * 16.0).to(gl.float8e4nv)
        bx.slice(ch * 64, 64).store(b)
    return s


@gluon.jit
def _wait_count(ptr, target):
    """Spin until the count at ptr reaches target (acquire: the counted tiles' h stores are visible after)."""
    while gl.atomic_add(ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    gl.thread_barrier()


@gluon.jit
def _h_chunk(bh, h_ptr, j, s0, n, I, KS: gl.constexpr, SEGP: gl.constexpr, num_warps: gl.constexpr):
    """B of n <= SEGP down steps from stage step s0: bh [SEGP * 8, 128] (8 rows a step), rows 0 / 1 = h[j]'s hi / lo at K step
    (s0 + i) % KS (L2 loads: other CTAs wrote them)."""
    lb: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    r = gl.expand_dims(gl.arange(0, SEGP * 8, gl.SliceLayout(1, lb)), 1)
    cc = gl.expand_dims(gl.arange(0, 128, gl.SliceLayout(0, lb)), 0)
    kk = ((s0 + r // 8) % KS) * 128 + cc
    ok = ((r % 8) < 2) & (r // 8 < n) & (kk < I)
    b = gl.load(h_ptr + j * (2 * I) + (r % 8) * I + kk, mask=ok, other=0.0, cache_modifier=".cg")
    bl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    bh.store(b)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _issue(info_smem, ring, ready, w1_desc, w2_desc, g, total, KS: gl.constexpr, STAGES: gl.constexpr,
           l8: gl.constexpr):
    """TMA of step g's weight tile into ring slot g % STAGES (nothing past the walk)."""
    if g < total:
        row = info_smem.index(g).load(l8)
        st = g % STAGES
        bar = ready.index(st)
        mbarrier.expect(bar, BN * BK)
        coord = [_field(row, F_ROW, l8), (_field(row, F_STEP, l8) % KS) * BK]
        if (_field(row, F_FLAGS, l8) & 1) == 0:
            tma.async_copy_global_to_shared(w1_desc, coord, bar, ring.index(st))
        else:
            tma.async_copy_global_to_shared(w2_desc, coord, bar, ring.index(st))


@gluon.jit
def _finish_gate_up(part_ptr, tick_ptr, pc_ptr, h_ptr, b1_ptr, j, e, tile, parts, NT1, I, stride_be1, limit, alpha,
                    hs, MAXP: gl.constexpr, num_warps: gl.constexpr):
    """Last part of gate_up tile (j, tile): sum the parts in part order, + b1, bf16, clamped SwiGLU, h as e4m3
    hi / lo, reset the ticket, count the tile for pair j."""
    lg: gl.constexpr = gl.BlockedLayout([MAXP, 1, 2], [1, 32, 1], [1, num_warps, 1], [2, 1, 0])
    pp = gl.expand_dims(gl.expand_dims(gl.arange(0, MAXP, gl.SliceLayout(1, gl.SliceLayout(2, lg))), 1), 2)
    oo = gl.expand_dims(gl.expand_dims(gl.arange(0, 32, gl.SliceLayout(0, gl.SliceLayout(2, lg))), 0), 2)
    gu = gl.expand_dims(gl.expand_dims(gl.arange(0, 2, gl.SliceLayout(0, gl.SliceLayout(1, lg))), 0), 1)
    v = gl.load(part_ptr + ((j * NT1 + tile) * MAXP + pp) * BN + 2 * oo + gu, mask=(pp < parts) & (oo >= 0) & (gu >= 0),
                other=0.0, cache_modifier=".cg")
    v = gl.sum(v, axis=0)                                                  # [32, 2]: gate, up (in-thread order)
    lv: gl.constexpr = gl.SliceLayout(0, lg)
    o2 = gl.expand_dims(gl.arange(0, 32, gl.SliceLayout(1, lv)), 1)
    g2 = gl.expand_dims(gl.arange(0, 2, gl.SliceLayout(0, lv)), 0)
    rows = tile * BN + 2 * o2 + g2
    v = (v + gl.load(b1_ptr + e.to(gl.int64) * stride_be1 + rows, mask=rows < 2 * I, other=0.0).to(gl.float32))
    v = v.to(gl.bfloat16).to(gl.float32)
    gate, up = gl.split(v)
    gate = gl.minimum(gate, limit)
    up = gl.minimum(gl.maximum(up, -limit), limit)
    h = (up + 1.0) * (gate / (1.0 + gl.exp(-alpha * gate)))
    t = h / hs
    hi = t.to(gl.float8e4nv)
    hcol = tile * (BN // 2) + gl.arange(0, 32, gl.SliceLayout(1, lv))
    h_ok = hcol < I
    gl.store(h_ptr + j * (2 * I) + hcol, hi, mask=h_ok)
    gl.store(h_ptr + j * (2 * I) + I + hcol, ((t - hi.to(gl.float32)) * 16.0).to(gl.float8e4nv), mask=h_ok)
    gl.atomic_xchg(tick_ptr, 0, sem="relaxed", scope="gpu")      # every part has arrived: reset for the next call
    gl.thread_barrier()                                          # every thread's h stores before the count
    gl.atomic_add(pc_ptr + j, 1, sem="release", scope="gpu")


@gluon.jit
def _finish_down(part_ptr, tick_ptr, ev, wt_ptr, b2_ptr, out_ptr, tile, parts, P, E, NT2, H, stride_be2,
                 PB: gl.constexpr, MAXP: gl.constexpr, num_warps: gl.constexpr):
    """Last part of down N tile ``tile`` over every local pair: out[0, rows] = sum over local pairs j of w_j *
    (sum of j's parts + b2[e_j, rows]) (in-thread sums in pair and part order)."""
    ld: gl.constexpr = gl.BlockedLayout([PB, MAXP, 1], [1, 1, 32], [1, 1, num_warps], [2, 1, 0])
    lj: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, ld))
    jj = gl.arange(0, PB, lj)
    e = gl.convert_layout(ev, lj)
    ok = (jj < P) & (e >= 0) & (e < E)
    w = gl.load(wt_ptr + jj, mask=ok, other=0.0).to(gl.float32)
    j3 = gl.expand_dims(gl.expand_dims(jj, 1), 2)
    ok3 = gl.expand_dims(gl.expand_dims(ok, 1), 2)
    p3 = gl.expand_dims(gl.expand_dims(gl.arange(0, MAXP, gl.SliceLayout(0, gl.SliceLayout(2, ld))), 0), 2)
    r3 = gl.expand_dims(gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(0, gl.SliceLayout(1, ld))), 0), 1)
    v = gl.load(part_ptr + ((j3 * NT2 + tile) * MAXP + p3) * BN + r3, mask=ok3 & (p3 < parts) & (r3 >= 0), other=0.0,
                cache_modifier=".cg")
    v = gl.sum(v, axis=1)                                                  # [PB, BN]
    lb: gl.constexpr = gl.SliceLayout(1, ld)
    rows = tile * BN + gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(0, lb)), 0)
    eb = gl.expand_dims(gl.convert_layout(gl.where(ok, e, 0), gl.SliceLayout(1, lb)), 1).to(gl.int64)
    okb = gl.expand_dims(gl.convert_layout(ok, gl.SliceLayout(1, lb)), 1)
    v += gl.load(b2_ptr + eb * stride_be2 + rows, mask=okb & (rows < H), other=0.0).to(gl.float32)
    y = gl.sum(v * gl.expand_dims(gl.convert_layout(w, gl.SliceLayout(1, lb)), 1), axis=0)   # [BN]
    ro = tile * BN + gl.arange(0, BN, gl.SliceLayout(0, lb))
    gl.store(out_ptr + ro, y.to(out_ptr.dtype.element_ty), mask=ro < H)
    gl.atomic_xchg(tick_ptr, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _partial(acc, kind, sx, hs, mma: gl.constexpr):
    """A tile's partial [BN] from acc [BN, 8]: scale * (column 0 + column 1 / 16)."""
    c = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, mma)), 0)
    w = gl.where(c == 0, 1.0, gl.where(c == 1, 1.0 / 16.0, 0.0))
    return gl.sum(acc * w, axis=1) * gl.where(kind == 0, sx, hs)


@gluon.jit
def moe_stream_kernel(x_ptr, ids_ptr, wt_ptr, w1_desc, s1_ptr, b1_ptr, w2_desc, s2_ptr, b2_ptr, h_ptr, part_ptr,
                      cnt_ptr, out_ptr, H, I, P, offset, E, stride_se1, stride_sn1, stride_se2, stride_sn2,
                      stride_be1, stride_be2, limit, alpha, hs,
                      KS: gl.constexpr, KSC: gl.constexpr, HP: gl.constexpr, NS: gl.constexpr, SEGP: gl.constexpr,
                      PB: gl.constexpr, MAXP: gl.constexpr, STAGES: gl.constexpr, ORDER: gl.constexpr,
                      num_warps: gl.constexpr, trace_ptr=None, TRACE: gl.constexpr = False):
    """One CTA per SM (cooperative grid G): the walk of ``_plan``, consumed step by step while the TMA ring runs
    STAGES steps ahead of it. cnt_ptr (int32): P * NT1 gate_up tickets, NT2 down tickets, P pair counts, done."""
    ts0 = _clk(TRACE, True)
    c = gl.program_id(0)
    G = gl.num_programs(0)
    NT1 = gl.cdiv(2 * I, BN)
    NT2 = gl.cdiv(H, BN)
    tick2 = cnt_ptr + P * NT1
    pc_ptr = tick2 + NT2
    done_ptr = pc_ptr + P
    part2 = part_ptr + P * NT1 * MAXP * BN
    l8: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, num_warps], [1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, 8, 32])
    bl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK], w1_desc.layout)
    bx2 = gl.allocate_shared_memory(gl.float8e4nv, [KSC * 64, BK], bl)     # stored as 2-D, read per step
    bh2 = gl.allocate_shared_memory(gl.float8e4nv, [SEGP * 8, BK], bl)
    bx = bx2._reinterpret(gl.float8e4nv, [KSC * 8, 8, BK], bl)               # .index(k): step k's [8, 128]
    bh = bh2._reinterpret(gl.float8e4nv, [SEGP, 8, BK], bl)
    il: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    info2 = gl.allocate_shared_memory(gl.int32, [NS, 8], il)
    info_smem = info2._reinterpret(gl.int32, [NS, 1, 8], il)                # .index(g): step g's row [1, 8]
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()

    L, jq, ev = _pairs(ids_ptr, P, offset, E, PB, num_warps)
    info, total = _plan(L, jq, ev, c, G, NT1, NT2, 2 * I, H, KS, NS, PB, ORDER, num_warps)
    info2.store(info)
    gl.thread_barrier()
    for g in range(STAGES):                           # the ring's first STAGES steps: weights only, no wait
        _issue(info_smem, ring, ready, w1_desc, w2_desc, g, total, KS, STAGES, l8)
    info = _scales(info, s1_ptr, s2_ptr, stride_se1, stride_sn1, stride_se2, stride_sn2, 2 * I, H, KS, num_warps)
    sx = _token(bx2, x_ptr, H, KSC, HP, num_warps)
    gl.thread_barrier()                               # (every thread's plan reads done before the rewrite)
    info2.store(info)
    fence_async_shared()
    gl.thread_barrier()

    if L == 0:                                        # nothing routed here: zeros, one N tile per CTA in turn
        lz: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        for t in range(c, NT2, G):
            rz = t * BN + gl.arange(0, BN, lz)
            gl.store(out_ptr + rz, gl.zeros([BN], gl.float32, lz).to(out_ptr.dtype.element_ty), mask=rz < H)
    acc = gl.zeros([BN, 8], gl.float32, mma)
    tl0 = _clk(TRACE, True)
    cyc_cnt = _clk(TRACE) * 0
    cyc_ready = cyc_cnt
    cyc_mma = cyc_cnt
    cyc_issue = cyc_cnt
    cyc_epi = cyc_cnt
    for g in range(total):
        st = g % STAGES
        row = info_smem.index(g).load(l8)
        flags = _field(row, F_FLAGS, l8)
        kind = flags & 1
        j = _field(row, F_PAIR, l8)
        pos = _field(row, F_POS, l8)
        s = _field(row, F_STEP, l8)
        t0 = _clk(TRACE)
        if kind == 1:
            if pos % SEGP == 0:                       # a down chunk starts: its pair's h complete, then its B rows
                _wait_count(pc_ptr + j, NT1)
                _h_chunk(bh2, h_ptr, j, s, gl.minimum((flags >> 2) - pos, SEGP), I, KS, SEGP, num_warps)
        t1 = _clk(TRACE)
        mbarrier.wait(ready.index(st), (g // STAGES) & 1)
        t2 = _clk(TRACE)
        if kind == 0:
            d = warpgroup_mma(ring.index(st), bx.index(s % KS).permute((1, 0)), gl.zeros([BN, 8], gl.float32, mma),
                              use_acc=False, is_async=True)
        else:
            d = warpgroup_mma(ring.index(st), bh.index(pos % SEGP).permute((1, 0)),
                              gl.zeros([BN, 8], gl.float32, mma), use_acc=False, is_async=True)
        d = warpgroup_mma_wait(0, deps=(d, ))
        acc += d * _field(row, F_SCALE, l8).to(gl.float32, bitcast=True)
        t3 = _clk(TRACE)
        gl.thread_barrier()                           # every warp's wgmma read slot st before its refill
        _issue(info_smem, ring, ready, w1_desc, w2_desc, g + STAGES, total, KS, STAGES, l8)
        t4 = _clk(TRACE)
        if ((flags >> 1) & 1) != 0:                   # the tile's last step here: its partial, the ticket
            tile = s // KS
            part = _field(row, F_PART, l8)
            parts = _field(row, F_PARTS, l8)
            v = _partial(acc, kind, sx, hs, mma)
            ro = gl.arange(0, BN, gl.SliceLayout(1, mma))
            if kind == 0:
                tick = cnt_ptr + j * NT1 + tile
                gl.store(part_ptr + ((j * NT1 + tile) * MAXP + part) * BN + ro, v)
                gl.thread_barrier()
                if gl.atomic_add(tick, 1, sem="acq_rel", scope="gpu") == parts - 1:
                    gl.thread_barrier()
                    _finish_gate_up(part_ptr, tick, pc_ptr, h_ptr, b1_ptr, j, gl.sum(gl.where(
                        gl.arange(0, PB, gl.BlockedLayout([PB], [32], [num_warps], [0])) == j, ev, 0), axis=0),
                        tile, parts, NT1, I, stride_be1, limit, alpha, hs, MAXP, num_warps)
            else:
                tick = tick2 + tile
                gl.store(part2 + ((j * NT2 + tile) * MAXP + part) * BN + ro, v)
                gl.thread_barrier()
                if gl.atomic_add(tick, 1, sem="acq_rel", scope="gpu") == L * parts - 1:
                    gl.thread_barrier()
                    _finish_down(part2, tick, ev, wt_ptr, b2_ptr, out_ptr, tile, parts, P, E, NT2, H, stride_be2, PB,
                                 MAXP, num_warps)
            acc = gl.zeros([BN, 8], gl.float32, mma)
        t5 = _clk(TRACE)
        cyc_cnt += t1 - t0
        cyc_ready += t2 - t1
        cyc_mma += t3 - t2
        cyc_issue += t4 - t3
        cyc_epi += t5 - t4
    if TRACE:   # diagnostic (bench/moe/stream_trace.py): ns start / loop / end, cycles per section of the loop
        tp = trace_ptr + c.to(gl.int64) * 8
        gl.store(tp, ts0)
        gl.store(tp + 1, tl0)
        gl.store(tp + 2, _clk(TRACE, True))
        gl.store(tp + 3, cyc_cnt)
        gl.store(tp + 4, cyc_ready)
        gl.store(tp + 5, cyc_mma)
        gl.store(tp + 6, cyc_issue)
        gl.store(tp + 7, cyc_epi)
    gl.thread_barrier()
    if gl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu") == G - 1:   # the last CTA: every wait has passed
        lr: gl.constexpr = gl.BlockedLayout([PB], [32], [num_warps], [0])
        pr = gl.arange(0, PB, lr)
        gl.store(pc_ptr + pr, gl.zeros([PB], gl.int32, lr), mask=pr < P)
        gl.atomic_xchg(done_ptr, 0, sem="relaxed", scope="gpu")


def _cta_of_host(s: int, W: int, G: int) -> int:
    return ((s + 1) * G + W - 1) // W - 1


def stream_shape(run, G: int) -> dict | None:
    """The constexprs of a ``MoeSplit`` call on this kernel with G CTAs, or None where it does not apply (not
    T = 1, more than 8 pairs, gate_up / down rows not a multiple of 64, gate_up and down K steps differ, weights
    not contiguous, or the walk or the shared memory would not fit)."""
    import triton

    ex, t = run.ex, run.tiles
    KS = triton.cdiv(run.H, 128)
    if run.T != 1 or run.P > 8 or (2 * run.I) % 64 or run.H % 64 or triton.cdiv(run.I, 128) != KS or \
            not ex.gate_up.is_contiguous() or not ex.down.is_contiguous() or not 0 < run.limit <= 16:
        return None
    NT1, NT2 = 2 * run.I // 64, run.H // 64
    if NT2 * KS < G:   # every CTA needs a step of each stream (the part counts assume no empty range)
        return None
    maxp = 1
    for W, nt in ((NT1 * KS, NT1), (NT2 * KS, NT2)):
        for n in range(nt):
            maxp = max(maxp, _cta_of_host(n * KS + KS - 1, W, G) - _cta_of_host(n * KS, W, G) + 1)
    ns = triton.next_power_of_2(run.P * (triton.cdiv(NT1 * KS, G) + triton.cdiv(NT2 * KS, G)))
    ksc = triton.next_power_of_2(triton.cdiv(KS, 8))
    smem = t.stream_stages * 8192 + ksc * 8 * 1024 + t.stream_segp * 1024 + ns * 32 + 4096
    if ns > 512 or smem > 226 * 1024:
        return None
    return dict(KS=KS, KSC=ksc, HP=triton.next_power_of_2(run.H), NS=ns, SEGP=t.stream_segp,
                PB=max(8, triton.next_power_of_2(run.P)), MAXP=triton.next_power_of_2(maxp), STAGES=t.stream_stages,
                ORDER=t.stream_order, NT1=NT1, NT2=NT2)


def _desc(w, E_N: int, K: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor.from_tensor(w.view(E_N, K), [64, 128],
                                        gl.NVMMASharedLayout.get_default_for([64, 128], gl.float8e4nv))


def launch_stream(run, shape: dict, G: int, alpha: float) -> None:
    """The whole MoE of ``run`` (a ``MoeSplit`` at T = 1): one cooperative launch of G CTAs into run.out.
    ``run.trace`` (diagnostic, ``bench/moe/stream_trace.py``): an int64 [G, 8] buffer for the kernel's TRACE."""
    import torch

    ex = run.ex
    E, P, H, I = run.E, run.P, run.H, run.I
    NT1, NT2, MAXP = shape["NT1"], shape["NT2"], shape["MAXP"]
    key = f"moe_stream_counts_{P}_{NT1}_{NT2}"
    cnt = ex.derived.get(key)
    if cnt is None:   # tickets, pair counts, done: zero between calls (reset by their last users)
        cnt = ex.derived[key] = torch.zeros((P * NT1 + NT2 + P + 1,), dtype=torch.int32, device=run.x.device)
    if run.stream_part is None:
        run.stream_part = torch.empty((P * (NT1 + NT2) * MAXP * 64,), dtype=torch.float32, device=run.x.device)
    w1, w2 = ex.gate_up, ex.down
    s1, s2 = ex.gate_up_scale, ex.down_scale
    consts = {k: v for k, v in shape.items() if k not in ("NT1", "NT2")}
    moe_stream_kernel[(G, )](
        run.x, run.ids, run.weights, _desc(w1, E * 2 * I, H), s1, ex.gate_up_bias, _desc(w2, E * H, I), s2,
        ex.down_bias, run.h.view(torch.float8_e4m3fn), run.stream_part, cnt, run.out, H, I, P, run.offset, E,
        s1.stride(0), s1.stride(1), s2.stride(0), s2.stride(1), ex.gate_up_bias.stride(0), ex.down_bias.stride(0),
        run.limit, alpha, (run.limit + 1.0) * run.limit / 448.0, num_warps=4, launch_cooperative_grid=True, **consts,
        **(dict(trace_ptr=run.trace, TRACE=True) if run.trace is not None else {}))
