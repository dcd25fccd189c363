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
def _xscale(x_ptr, H, HP: gl.constexpr, num_warps: gl.constexpr):
    """s = max |x| / 448 over the token (T = 1)."""
    lx: gl.constexpr = gl.BlockedLayout([HP // (32 * num_warps)], [32], [num_warps], [0])
    ox = gl.arange(0, HP, lx)
    return gl.maximum(gl.max(gl.abs(gl.load(x_ptr + ox, mask=ox < H, other=0.0).to(gl.float32)), axis=0),
                      1e-30) / FP8_MAX


@gluon.jit
def _token(bx, x_ptr, H, s, KSC: gl.constexpr, num_warps: gl.constexpr):
    """B of the gate_up steps: bx [KSC * 64, 128] e4m3 (8 rows a step), step k's rows 0 / 1 = hi / lo of
    x[k * 128 : + 128] / s (rows 2-7 zero)."""
    lb: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    r = gl.expand_dims(gl.arange(0, 64, gl.SliceLayout(1, lb)), 1)                # 8 steps x 8 rows
    cc = gl.expand_dims(gl.arange(0, 128, gl.SliceLayout(0, lb)), 0)
    for ch in gl.static_range(KSC):
        kx = (ch * 8 + r // 8) * 128 + cc
        v = gl.load(x_ptr + kx, mask=((r % 8) < 2) & (kx < H), other=0.0).to(gl.float32) / s
        hi = v.to(gl.float8e4nv).to(gl.float32)
        b = gl.where((r % 8) == 0, hi, (v - hi) * 16.0).to(gl.float8e4nv)
        bx.slice(ch * 64, 64).store(b)


@gluon.jit
def _pack(v, tag):
    """fp32 values -> int64 words (tag << 32 | bits): a word is its own ready flag (no fence, no counter)."""
    return (v.to(gl.int32, bitcast=True).to(gl.int64) & 0xFFFFFFFF) | (tag.to(gl.int64) << 32)


@gluon.jit
def _unpack(w):
    return (w & 0xFFFFFFFF).to(gl.int32).to(gl.float32, bitcast=True)


@gluon.jit
def _poll(ptrs, mask, tag):
    """The words at ptrs (masked lanes: 0), re-read (volatile: L2) until every one carries this call's tag."""
    w = gl.load(ptrs, mask=mask, other=0, volatile=True)
    while gl.sum(gl.sum(gl.sum(gl.where(mask & ((w >> 32) != tag.to(gl.int64)), 1, 0), axis=2), axis=1),
                 axis=0) > 0:
        w = gl.load(ptrs, mask=mask, other=0, volatile=True)
    return w


@gluon.jit
def _poll2(pa, pb, mask, tag):
    """``_poll`` of two word sets at once (both loads in flight together: one round trip when they are ready)."""
    wa = gl.load(pa, mask=mask, other=0, volatile=True)
    wb = gl.load(pb, mask=mask, other=0, volatile=True)
    t = tag.to(gl.int64)
    while gl.sum(gl.sum(gl.sum(gl.where(mask & (((wa >> 32) != t) | ((wb >> 32) != t)), 1, 0), axis=2), axis=1),
                 axis=0) > 0:
        wa = gl.load(pa, mask=mask, other=0, volatile=True)
        wb = gl.load(pb, mask=mask, other=0, volatile=True)
    return wa, wb


@gluon.jit
def _h_chunk(bh, gp_ptr, b1_ptr, e, j, s0, n, I, NT1, G, tag, stride_be1, limit, alpha, hs, KS: gl.constexpr,
             SEGP: gl.constexpr, MAXP1: gl.constexpr, num_warps: gl.constexpr):
    """B of n <= SEGP down steps from stage step s0 (K steps (s0 + i) % KS) of pair j: h = clamped SwiGLU of
    (the gate_up parts of this call, summed in part order, + b1), as e4m3 hi / lo rows (scale hs) in bh
    [SEGP * 8, 128]: rows 8 i + even = hi, odd = lo."""
    l4: gl.constexpr = gl.BlockedLayout([1, 1, MAXP1], [1, 32, 1], [1, num_warps, 1], [2, 1, 0])
    i3 = gl.expand_dims(gl.expand_dims(gl.arange(0, SEGP, gl.SliceLayout(1, gl.SliceLayout(2, l4))), 1), 2)
    c3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 128, gl.SliceLayout(0, gl.SliceLayout(2, l4))), 0), 2)
    p3 = gl.expand_dims(gl.expand_dims(gl.arange(0, MAXP1, gl.SliceLayout(0, gl.SliceLayout(1, l4))), 0), 1)
    m = ((s0 + i3) % KS) * 128 + c3                                         # h column
    tile = m // 32
    W1 = NT1 * KS
    first = _cta_of(tile * KS, W1, G)
    ok = (i3 < n) & (m < I) & (p3 < _cta_of(tile * KS + KS - 1, W1, G) - first + 1)
    base = gp_ptr + ((j * NT1 + tile) * MAXP1 + p3) * BN + 2 * (m % 32)
    l2: gl.constexpr = gl.SliceLayout(2, l4)
    m2 = gl.sum(gl.where(p3 == 0, m, 0), axis=2)
    ok2 = (gl.expand_dims(gl.arange(0, SEGP, gl.SliceLayout(1, l2)), 1) < n) & (m2 < I)
    bias = b1_ptr + e.to(gl.int64) * stride_be1 + 2 * m2
    bg = gl.load(bias, mask=ok2, other=0.0).to(gl.float32)                 # (issued with the first poll)
    bu = gl.load(bias + 1, mask=ok2, other=0.0).to(gl.float32)
    wg_, wu_ = _poll2(base, base + 1, ok, tag)
    gate = (gl.sum(_unpack(wg_), axis=2) + bg).to(gl.bfloat16).to(gl.float32)   # [SEGP, 128], parts in order
    up = (gl.sum(_unpack(wu_), axis=2) + bu).to(gl.bfloat16).to(gl.float32)
    gate = gl.minimum(gate, limit)
    up = gl.minimum(gl.maximum(up, -limit), limit)
    t = gl.where(ok2, (up + 1.0) * (gate / (1.0 + gl.exp(-alpha * gate))) / hs, 0.0)
    hi = t.to(gl.float8e4nv).to(gl.float32)
    lo = (t - hi) * 16.0
    l3: gl.constexpr = gl.BlockedLayout([1, 8, 1], [1, 1, 32], [1, 1, num_warps], [2, 1, 0])
    r3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, gl.SliceLayout(2, l3))), 0), 2)
    hi3 = gl.expand_dims(gl.convert_layout(hi, gl.SliceLayout(1, l3)), 1)
    lo3 = gl.expand_dims(gl.convert_layout(lo, gl.SliceLayout(1, l3)), 1)
    b = gl.where(r3 % 2 == 0, hi3, lo3).to(gl.float8e4nv)                  # [SEGP, 8, 128]
    bh.store(gl.reshape(b, [SEGP * 8, 128]))
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
def _combine(dp_ptr, ev, wt_ptr, b2_ptr, out_ptr, tile, P, E, NT2, H, G, tag, stride_be2, KS: gl.constexpr,
             PB: gl.constexpr, MAXP2: gl.constexpr, num_warps: gl.constexpr):
    """out[0, rows of N tile ``tile``] = sum over local pairs j of w_j * (sum of j's down parts + b2[e_j]) (in-thread
    sums in pair and part order), once every part of this call is there (no local pair: zeros)."""
    ld: gl.constexpr = gl.BlockedLayout([PB, MAXP2, 1], [1, 1, 32], [1, 1, num_warps], [2, 1, 0])
    lj: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, ld))
    jj = gl.arange(0, PB, lj)
    e = gl.convert_layout(ev, lj)
    ok = (jj < P) & (e >= 0) & (e < E)
    w = gl.load(wt_ptr + jj, mask=ok, other=0.0).to(gl.float32)
    W2 = NT2 * KS
    first = _cta_of(tile * KS, W2, G)
    parts = _cta_of(tile * KS + KS - 1, W2, G) - first + 1
    j3 = gl.expand_dims(gl.expand_dims(jj, 1), 2)
    ok3 = gl.expand_dims(gl.expand_dims(ok, 1), 2)
    p3 = gl.expand_dims(gl.expand_dims(gl.arange(0, MAXP2, gl.SliceLayout(0, gl.SliceLayout(2, ld))), 0), 2)
    r3 = gl.expand_dims(gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(0, gl.SliceLayout(1, ld))), 0), 1)
    v = gl.sum(_unpack(_poll(dp_ptr + ((j3 * NT2 + tile) * MAXP2 + p3) * BN + r3, ok3 & (p3 < parts) & (r3 >= 0),
                             tag)), axis=1)                                 # [PB, BN]
    lb: gl.constexpr = gl.SliceLayout(1, ld)
    rows = tile * BN + gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(0, lb)), 0)
    eb = gl.expand_dims(gl.convert_layout(gl.where(ok, e, 0), gl.SliceLayout(1, lb)), 1).to(gl.int64)
    okb = gl.expand_dims(gl.convert_layout(ok, gl.SliceLayout(1, lb)), 1)
    v += gl.load(b2_ptr + eb * stride_be2 + rows, mask=okb & (rows < H), other=0.0).to(gl.float32)
    y = gl.sum(v * gl.expand_dims(gl.convert_layout(w, gl.SliceLayout(1, lb)), 1), axis=0)   # [BN]
    ro = tile * BN + gl.arange(0, BN, gl.SliceLayout(0, lb))
    gl.store(out_ptr + ro, y.to(out_ptr.dtype.element_ty), mask=ro < H)


@gluon.jit
def _partial(acc, kind, sx, hs, mma: gl.constexpr):
    """A tile's partial [BN] from acc [BN, 8]: scale * (column 0 + column 1 / 16)."""
    c = gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, mma)), 0)
    w = gl.where(c == 0, 1.0, gl.where(c == 1, 1.0 / 16.0, 0.0))
    return gl.sum(acc * w, axis=1) * gl.where(kind == 0, sx, hs)


@gluon.jit
def moe_stream_kernel(x_ptr, ids_ptr, wt_ptr, w1_desc, s1_ptr, b1_ptr, w2_desc, s2_ptr, b2_ptr, part_ptr,
                      ctrl_ptr, out_ptr, H, I, P, offset, E, stride_se1, stride_sn1, stride_se2, stride_sn2,
                      stride_be1, stride_be2, limit, alpha, hs,
                      KS: gl.constexpr, KSC: gl.constexpr, HP: gl.constexpr, NS: gl.constexpr, SEGP: gl.constexpr,
                      PB: gl.constexpr, MAXP1: gl.constexpr, MAXP2: gl.constexpr, STAGES: gl.constexpr,
                      ORDER: gl.constexpr, num_warps: gl.constexpr, trace_ptr=None, TRACE: gl.constexpr = False):
    """R CTAs per SM (cooperative grid G): the walk of ``_plan``, consumed step by step while the TMA ring runs
    STAGES steps ahead of it. part_ptr (int64 words, ``_pack``): gate_up parts [P, NT1, MAXP1, 64], then down parts
    [P, NT2, MAXP2, 64]; ctrl_ptr (int32): CTAs done, the last call's tag."""
    ts0 = _clk(TRACE, True)
    c = gl.program_id(0)
    G = gl.num_programs(0)
    NT1 = gl.cdiv(2 * I, BN)
    NT2 = gl.cdiv(H, BN)
    dp_ptr = part_ptr + P * NT1 * MAXP1 * BN
    l8: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, num_warps], [1, 0])
    lp: gl.constexpr = gl.BlockedLayout([PB], [32], [num_warps], [0])
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

    # the small loads first, while the memory system is idle (behind the weight stream they would wait us)
    tag = gl.load(ctrl_ptr + 1) % 0x7FFFFFFF + 1                            # this call's word tag (never 0)
    sx = _xscale(x_ptr, H, HP, num_warps)
    L, jq, ev = _pairs(ids_ptr, P, offset, E, PB, num_warps)
    info, total = _plan(L, jq, ev, c, G, NT1, NT2, 2 * I, H, KS, NS, PB, ORDER, num_warps)
    info2.store(info)
    gl.thread_barrier()
    for g in range(2):                                # two steps in flight now (a short queue for what follows)
        _issue(info_smem, ring, ready, w1_desc, w2_desc, g, total, KS, STAGES, l8)
    info = _scales(info, s1_ptr, s2_ptr, stride_se1, stride_sn1, stride_se2, stride_sn2, 2 * I, H, KS, num_warps)
    _token(bx2, x_ptr, H, sx, KSC, num_warps)          # (x is in L1 now)
    gl.thread_barrier()                               # (every thread's plan reads done before the rewrite)
    info2.store(info)
    fence_async_shared()
    gl.thread_barrier()
    for g in range(2, STAGES):                        # the rest of the ring: weights only, no wait
        _issue(info_smem, ring, ready, w1_desc, w2_desc, g, total, KS, STAGES, l8)

    tl0 = _clk(TRACE, True)
    cyc_cnt = _clk(TRACE) * 0
    cyc_ready = cyc_cnt
    cyc_mma = cyc_cnt
    cyc_issue = cyc_cnt
    cyc_epi = cyc_cnt
    acc = gl.zeros([BN, 8], gl.float32, mma)
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
            if pos % SEGP == 0:                       # a down chunk starts: its h from this call's gate_up parts
                _h_chunk(bh2, part_ptr, b1_ptr, gl.sum(gl.where(gl.arange(0, PB, lp) == j, ev, 0), axis=0), j, s,
                         gl.minimum((flags >> 2) - pos, SEGP), I, NT1, G, tag, stride_be1, limit, alpha, hs, KS,
                         SEGP, MAXP1, num_warps)
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
        if ((flags >> 1) & 1) != 0:                   # the tile's last step here: its partial as tagged words
            tile = s // KS
            part = _field(row, F_PART, l8)
            v = _pack(_partial(acc, kind, sx, hs, mma), tag)
            ro = gl.arange(0, BN, gl.SliceLayout(1, mma))
            if kind == 0:
                gl.store(part_ptr + ((j * NT1 + tile) * MAXP1 + part) * BN + ro, v)
            else:
                gl.store(dp_ptr + ((j * NT2 + tile) * MAXP2 + part) * BN + ro, v)
            acc = gl.zeros([BN, 8], gl.float32, mma)
        t5 = _clk(TRACE)
        cyc_cnt += t1 - t0
        cyc_ready += t2 - t1
        cyc_mma += t3 - t2
        cyc_issue += t4 - t3
        cyc_epi += t5 - t4
    tl1 = _clk(TRACE, True)
    for t in range(c, NT2, G):                        # the output tiles this CTA sums (no local pair: zeros)
        _combine(dp_ptr, ev, wt_ptr, b2_ptr, out_ptr, t, P, E, NT2, H, G, tag, stride_be2, KS, PB, MAXP2,
                 num_warps)
    gl.thread_barrier()
    if gl.atomic_add(ctrl_ptr, 1, sem="acq_rel", scope="gpu") == G - 1:   # the last CTA: every tag read is done
        gl.atomic_xchg(ctrl_ptr + 1, tag, sem="relaxed", scope="gpu")
        gl.atomic_xchg(ctrl_ptr, 0, sem="relaxed", scope="gpu")
    if TRACE:   # diagnostic (bench/moe/stream_trace.py): ns start / loop / end, cycles per section of the loop
        tp = trace_ptr + c.to(gl.int64) * 8
        gl.store(tp, ts0)
        gl.store(tp + 1, tl0)
        gl.store(tp + 2, tl1)
        gl.store(tp + 3, cyc_cnt)
        gl.store(tp + 4, cyc_ready)
        gl.store(tp + 5, cyc_mma)
        gl.store(tp + 6, cyc_issue)
        gl.store(tp + 7, _clk(TRACE, True) - tl1)


def _cta_of_host(s: int, W: int, G: int) -> int:
    return ((s + 1) * G + W - 1) // W - 1


def stream_shape(run, G: int) -> dict | None:
    """The constexprs of a ``MoeSplit`` call on this kernel with G CTAs (``stream_ctas`` per SM), or None where it
    does not apply: not T = 1, more than 8 pairs, gate_up / down rows not a multiple of 64, gate_up and down K steps
    differ, weights not contiguous, h's fixed scale out of range, fewer steps than CTAs, or the walk or the shared
    memory would not fit."""
    import triton

    ex, t = run.ex, run.tiles
    KS = triton.cdiv(run.H, 128)
    if run.T != 1 or run.P > 8 or (2 * run.I) % 64 or run.H % 64 or triton.cdiv(run.I, 128) != KS or \
            not ex.gate_up.is_contiguous() or not ex.down.is_contiguous() or not 0 < run.limit <= 16:
        return None
    NT1, NT2 = 2 * run.I // 64, run.H // 64
    if NT2 * KS < G:   # every CTA needs a step of each stream (the part counts assume no empty range)
        return None
    maxp = []
    for W, nt in ((NT1 * KS, NT1), (NT2 * KS, NT2)):
        maxp.append(max(_cta_of_host(n * KS + KS - 1, W, G) - _cta_of_host(n * KS, W, G) + 1 for n in range(nt)))
    ns = triton.next_power_of_2(run.P * (triton.cdiv(NT1 * KS, G) + triton.cdiv(NT2 * KS, G)))
    ksc = triton.next_power_of_2(triton.cdiv(KS, 8))
    smem = t.stream_stages * 8192 + ksc * 8 * 1024 + t.stream_segp * 1024 + ns * 32 + 2048
    if ns > 512 or smem > (227 * 1024) // t.stream_ctas - 1024:
        return None
    return dict(KS=KS, KSC=ksc, HP=triton.next_power_of_2(run.H), NS=ns, SEGP=t.stream_segp,
                PB=max(8, triton.next_power_of_2(run.P)), MAXP1=triton.next_power_of_2(maxp[0]),
                MAXP2=triton.next_power_of_2(maxp[1]), STAGES=t.stream_stages, ORDER=t.stream_order, NT1=NT1, NT2=NT2)


def _desc(w, E_N: int, K: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor.from_tensor(w.view(E_N, K), [64, 128],
                                        gl.NVMMASharedLayout.get_default_for([64, 128], gl.float8e4nv))


def launch_stream(run, shape: dict, G: int, alpha: float) -> None:
    """The whole MoE of ``run`` (a ``MoeSplit`` at T = 1): one cooperative launch of G CTAs into run.out.
    The tagged part words and the control words (done count, last tag) live with the weights, zeroed once (tag 0
    is never a call's). ``run.trace`` (diagnostic, ``bench/moe/stream_trace.py``): int64 [G, 8] for TRACE."""
    import torch

    ex = run.ex
    E, P, H, I = run.E, run.P, run.H, run.I
    NT1, NT2 = shape["NT1"], shape["NT2"]
    key = f"moe_stream_words_{P}_{NT1}_{NT2}_{shape['MAXP1']}_{shape['MAXP2']}"
    words = ex.derived.get(key)
    if words is None:
        words = ex.derived[key] = torch.zeros((P * (NT1 * shape["MAXP1"] + NT2 * shape["MAXP2"]) * 64,),
                                              dtype=torch.int64, device=run.x.device)
    ctrl = ex.derived.get("moe_stream_ctrl")
    if ctrl is None:
        ctrl = ex.derived["moe_stream_ctrl"] = torch.zeros((2,), dtype=torch.int32, device=run.x.device)
    w1, w2 = ex.gate_up, ex.down
    s1, s2 = ex.gate_up_scale, ex.down_scale
    consts = {k: v for k, v in shape.items() if k not in ("NT1", "NT2")}
    opts = dict(maxnreg=65536 // (128 * run.tiles.stream_ctas) // 8 * 8) if run.tiles.stream_ctas > 2 else {}
    moe_stream_kernel[(G, )](
        run.x, run.ids, run.weights, _desc(w1, E * 2 * I, H), s1, ex.gate_up_bias, _desc(w2, E * H, I), s2,
        ex.down_bias, words, ctrl, run.out, H, I, P, run.offset, E,
        s1.stride(0), s1.stride(1), s2.stride(0), s2.stride(1), ex.gate_up_bias.stride(0), ex.down_bias.stride(0),
        run.limit, alpha, (run.limit + 1.0) * run.limit / 448.0, num_warps=4, launch_cooperative_grid=True, **consts,
        **opts, **(dict(trace_ptr=run.trace, TRACE=True) if run.trace is not None else {}))
