"""Triton kernels of the decode-sized fused MoE (``triton_moe_small`` launches them; T * k <= 256 pairs).

The large-M pipeline (``triton_moe``) sorts pairs by expert in three launches, then runs two grouped
GEMMs and a combine: six launches whose fixed costs dominate at 1-64 tokens. Here:
  1. ``gate_up``: program (slot s, N tile). Slot s is the s-th smallest local expert that any pair
     routes to, found in-kernel from a histogram of the ids (slots past the last touched expert exit
     at once). The program gathers that expert's tokens (ascending token order; a token routes to an
     expert at most once) as the M side of the dot, in chunks of BM rows, and streams its FP8 weight
     tile once per chunk (one chunk unless an expert has more than BM tokens). Epilogue: ``+ b1``,
     rounded to bf16 like the reference, clamped SwiGLU on the interleaved gate (even) / up (odd)
     columns -> h [P, I] bf16, row = pair id (token * k + slot).
  2. ``down``: same slot/row mapping over h; epilogue ``(acc + b2) * routing weight`` -> y [P, H]
     fp32. With ``fused_combine`` every program then counts its rows in per (token, N tile) arrival
     counters (zeroed by gate_up); the program that completes a token's count sums that token's y
     rows in route order (fixed order: deterministic) and writes out[t] bf16. Tokens with no local
     route are written as zeros. Without it (the default: faster in runs 1-2) a third launch does the
     same combine.
  0. optional ``plan`` (one program per slot): the slot's expert, token count and pair ids written to
     small tables, so the GEMM programs read their rows instead of working them out; the routing
     prologue is what sets their register count (compiled for sm_90: gate_up 136 -> 96, down
     188 -> 102 registers, i.e. 3 -> 5 and 2 -> 4 programs per SM). Not yet timed on a GPU.
Activations stay bf16 (weight-only: each FP8 tile widened to bf16 in registers, block scale applied
per 128-wide K step), so there is no activation quantization error at all; tests bound the error by
the reference's own FP8 emulation error. Expert parallel: ``experts.derived["expert_offset"]``.
Static shapes for a given T and no host syncs: CUDA-graph capturable.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _slot_expert(ids_ptr, s, T, offset, E, TOPK: tl.constexpr, PB: tl.constexpr, EB: tl.constexpr):
    """Local expert of slot s (the s-th smallest touched local id), -1 when fewer are touched."""
    i = tl.arange(0, PB)
    ok = i < T * TOPK
    e = tl.load(ids_ptr + i, mask=ok, other=-1).to(tl.int32) - offset
    e = tl.where(ok & (e >= 0) & (e < E), e, E)                      # bin E: not on this rank
    ex = tl.arange(0, EB)
    present = (tl.histogram(e, EB) > 0) & (ex < E)
    rank = tl.cumsum(present.to(tl.int32), 0) - 1
    return tl.max(tl.where(present & (rank == s), ex, -1), 0)


@triton.jit
def _expert_tokens(ids_ptr, e, T, offset, TOPK: tl.constexpr, TB: tl.constexpr, KP: tl.constexpr):
    """Per token t [TB]: routes to local expert e (0/1), its slot j there, rank among those tokens."""
    t = tl.arange(0, TB)
    j = tl.arange(0, KP)
    ok = (t < T)[:, None] & (j < TOPK)[None, :]
    ids = tl.load(ids_ptr + t[:, None] * TOPK + j[None, :], mask=ok, other=-1).to(tl.int32) - offset
    match = ok & (ids == e)
    tin = tl.sum(match.to(tl.int32), 1)
    jsel = tl.sum(tl.where(match, j[None, :], 0), 1)
    return tin, jsel, tl.cumsum(tin, 0) - 1, tl.sum(tin, 0)


@triton.jit
def _rows(tin, jsel, rank, cnt, c, TOPK: tl.constexpr, TB: tl.constexpr, BM: tl.constexpr):
    """Rows c .. c+BM of the expert's token list -> (token [BM], pair id [BM], row valid [BM])."""
    m = c + tl.arange(0, BM)
    sel = (tin > 0)[None, :] & (rank[None, :] == m[:, None])          # [BM, TB]
    tok = tl.sum(tl.where(sel, tl.arange(0, TB)[None, :], 0), 1)
    pair = tok * TOPK + tl.sum(tl.where(sel, jsel[None, :], 0), 1)
    return tok, pair, m < cnt


@triton.jit
def plan_kernel(ids_ptr, slot_e_ptr, slot_cnt_ptr, slot_pairs_ptr, T, offset, E,
                 TOPK: tl.constexpr, TB: tl.constexpr, KP: tl.constexpr, EB: tl.constexpr):
    """Program s: slot s's local expert (-1: unused), its token count and pair ids (token order)."""
    s = tl.program_id(0)
    e = _slot_expert(ids_ptr, s, T, offset, E, TOPK, TB * KP, EB)
    tin, jsel, rank, cnt = _expert_tokens(ids_ptr, e, T, offset, TOPK, TB, KP)
    t = tl.arange(0, TB)
    tl.store(slot_pairs_ptr + s * TB + rank, t * TOPK + jsel, mask=(tin > 0) & (e >= 0))
    tl.store(slot_e_ptr + s, e)
    tl.store(slot_cnt_ptr + s, tl.where(e >= 0, cnt, 0))


@triton.jit
def _slot(ids_ptr, slot_e_ptr, slot_cnt_ptr, s, T, offset, E, TOPK: tl.constexpr, TB: tl.constexpr,
          KP: tl.constexpr, EB: tl.constexpr, PLAN: tl.constexpr):
    """(expert, token count, tin, jsel, rank) of slot s; from the plan tables when PLAN (then the
    last three are unused placeholders)."""
    if PLAN:
        e = tl.load(slot_e_ptr + s)
        cnt = tl.load(slot_cnt_ptr + s)
        z = tl.zeros((TB,), tl.int32)
        return e, cnt, z, z, z
    else:
        e = _slot_expert(ids_ptr, s, T, offset, E, TOPK, TB * KP, EB)
        tin, jsel, rank, cnt = _expert_tokens(ids_ptr, e, T, offset, TOPK, TB, KP)
        return e, cnt, tin, jsel, rank


@triton.jit
def _slot_rows(slot_pairs_ptr, s, tin, jsel, rank, cnt, c, TOPK: tl.constexpr, TB: tl.constexpr,
               BM: tl.constexpr, PLAN: tl.constexpr):
    """Rows c .. c+BM of slot s -> (token [BM], pair id [BM], row valid [BM])."""
    if PLAN:
        m = c + tl.arange(0, BM)
        row_ok = m < cnt
        pair = tl.load(slot_pairs_ptr + s * TB + m, mask=row_ok, other=0)
        return pair // TOPK, pair, row_ok
    else:
        return _rows(tin, jsel, rank, cnt, c, TOPK, TB, BM)


@triton.jit
def _stream(a_ptrs, row_ok, b_ptrs, s_ptr, n_ok, K, BM: tl.constexpr, BN: tl.constexpr,
            BK_: tl.constexpr, KBP: tl.constexpr, DOT_F32: tl.constexpr):
    """acc [BM, BN] = A [BM, K] (bf16 rows) @ (fp8 tile [K, BN] * its 128x128 block scales)."""
    offs_k = tl.arange(0, BK_)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    # all block scales of the tile's K row up front (registers); a scale load in the step that uses
    # it stalls every step on an L2 round trip before the next tiles' copies are issued (run 1)
    nkb = tl.cdiv(K, BK_)
    kidx = tl.arange(0, KBP)
    svec = tl.load(s_ptr + kidx, mask=kidx < nkb, other=0.0)
    for kb in range(0, nkb):
        k_ok = offs_k < K - kb * BK_
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        sb = tl.sum(tl.where(kidx == kb, svec, 0.0), 0)
        if DOT_F32:  # the CPU interpreter mis-multiplies bf16 dots
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32)) * sb
        else:
            acc += tl.dot(a, b.to(tl.bfloat16)) * sb
        a_ptrs += BK_
        b_ptrs += BK_
    return acc


@triton.jit
def gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, h_ptr, cnt_ptr, slot_e_ptr, slot_cnt_ptr, slot_pairs_ptr,
                    T, K, N, E, offset, n_tiles, cnt_total,
                    stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_h,
                    limit, alpha,
                    TOPK: tl.constexpr, TB: tl.constexpr, KP: tl.constexpr, EB: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK_: tl.constexpr, KBP: tl.constexpr,
                    PLAN: tl.constexpr, DOT_F32: tl.constexpr):
    pid = tl.program_id(0)
    s = pid // n_tiles
    pid_n = pid % n_tiles
    if s == 0:  # zero the down kernel's arrival counters (cnt_total = 0 without the fused combine)
        for z0 in range(pid_n * 64, cnt_total, n_tiles * 64):
            z = z0 + tl.arange(0, 64)
            tl.store(cnt_ptr + z, tl.zeros((64,), tl.int32), mask=z < cnt_total)
    e, cnt, tin, jsel, rank = _slot(ids_ptr, slot_e_ptr, slot_cnt_ptr, s, T, offset, E, TOPK, TB, KP, EB, PLAN)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    offs_nc = tl.where(n_ok, offs_n, 0)
    offs_k = tl.arange(0, BK_)
    b_ptrs = w_ptr + e64 * stride_we + offs_nc[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    sc_ptr = s_ptr + e64 * stride_se + ((pid_n * BN) // 128) * stride_sn
    bias = tl.load(b_ptr + e64 * stride_be + offs_nc, mask=n_ok, other=0.0).to(tl.float32)
    offs_h = pid_n * (BN // 2) + tl.arange(0, BN // 2)
    for c in range(0, cnt, BM):
        tok, pair, row_ok = _slot_rows(slot_pairs_ptr, s, tin, jsel, rank, cnt, c, TOPK, TB, BM, PLAN)
        a_ptrs = x_ptr + tok.to(tl.int64)[:, None] * stride_x + offs_k[None, :]
        acc = _stream(a_ptrs, row_ok, b_ptrs, sc_ptr, n_ok, K, BM, BN, BK_, KBP, DOT_F32)
        v = (acc + bias[None, :]).to(tl.bfloat16).to(tl.float32)        # gate_up rounded like the reference
        gate, up = tl.split(tl.reshape(v, (BM, BN // 2, 2)))
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        h = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
        tl.store(h_ptr + pair.to(tl.int64)[:, None] * stride_h + offs_h[None, :], h.to(tl.bfloat16),
                 mask=row_ok[:, None] & (offs_h < N // 2)[None, :])


@triton.jit
def down_kernel(h_ptr, ids_ptr, wt_ptr, w_ptr, s_ptr, b_ptr, y_ptr, out_ptr, cnt_ptr, slot_e_ptr, slot_cnt_ptr,
                 slot_pairs_ptr,
                 T, K, N, E, offset, n_tiles,
                 stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_y, stride_o,
                 TOPK: tl.constexpr, TB: tl.constexpr, KP: tl.constexpr, EB: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK_: tl.constexpr, KBP: tl.constexpr, FUSED: tl.constexpr,
                 PLAN: tl.constexpr, DOT_F32: tl.constexpr):
    pid = tl.program_id(0)
    s = pid // n_tiles
    pid_n = pid % n_tiles
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    offs_nc = tl.where(n_ok, offs_n, 0)
    if FUSED:
        if s == 0:  # tokens with no route to this rank: nobody completes them, write zeros
            t = tl.arange(0, TB)
            jj = tl.arange(0, KP)
            okt = (t < T)[:, None] & (jj < TOPK)[None, :]
            le = tl.load(ids_ptr + t[:, None] * TOPK + jj[None, :], mask=okt, other=-1).to(tl.int32) - offset
            need = tl.sum((okt & (le >= 0) & (le < E)).to(tl.int32), 1)
            zmask = ((t < T) & (need == 0))[:, None] & n_ok[None, :]
            tl.store(out_ptr + t.to(tl.int64)[:, None] * stride_o + offs_n[None, :],
                     tl.zeros((TB, BN), tl.float32).to(out_ptr.dtype.element_ty), mask=zmask)
    e, cnt, tin, jsel, rank = _slot(ids_ptr, slot_e_ptr, slot_cnt_ptr, s, T, offset, E, TOPK, TB, KP, EB, PLAN)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    offs_k = tl.arange(0, BK_)
    b_ptrs = w_ptr + e64 * stride_we + offs_nc[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    sc_ptr = s_ptr + e64 * stride_se + ((pid_n * BN) // 128) * stride_sn
    bias = tl.load(b_ptr + e64 * stride_be + offs_nc, mask=n_ok, other=0.0).to(tl.float32)
    for c in range(0, cnt, BM):
        tok, pair, row_ok = _slot_rows(slot_pairs_ptr, s, tin, jsel, rank, cnt, c, TOPK, TB, BM, PLAN)
        a_ptrs = h_ptr + pair.to(tl.int64)[:, None] * stride_h + offs_k[None, :]
        acc = _stream(a_ptrs, row_ok, b_ptrs, sc_ptr, n_ok, K, BM, BN, BK_, KBP, DOT_F32)
        wt = tl.load(wt_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
        y = (acc + bias[None, :]) * wt[:, None]
        tile_ok = row_ok[:, None] & n_ok[None, :]
        tl.store(y_ptr + pair.to(tl.int64)[:, None] * stride_y + offs_n[None, :], y, mask=tile_ok)
        if FUSED:
            tl.debug_barrier()                                   # the whole y tile is stored ...
            old = tl.atomic_add(cnt_ptr + tok * n_tiles + pid_n, 1, mask=row_ok)  # ... before it counts
            need = tl.zeros((BM,), tl.int32)
            for j in tl.static_range(TOPK):
                ej = tl.load(ids_ptr + tok * TOPK + j, mask=row_ok, other=-1).to(tl.int32) - offset
                need += ((ej >= 0) & (ej < E)).to(tl.int32)
            last = row_ok & (old + 1 == need)
            tl.debug_barrier()
            tot = tl.zeros((BM, BN), dtype=tl.float32)
            for j in tl.static_range(TOPK):                      # route order: same sum whoever is last
                ej = tl.load(ids_ptr + tok * TOPK + j, mask=last, other=-1).to(tl.int32) - offset
                okj = last & (ej >= 0) & (ej < E)
                tot += tl.load(y_ptr + (tok * TOPK + j).to(tl.int64)[:, None] * stride_y + offs_n[None, :],
                               mask=okj[:, None] & n_ok[None, :], other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + tok.to(tl.int64)[:, None] * stride_o + offs_n[None, :],
                     tot.to(out_ptr.dtype.element_ty), mask=last[:, None] & n_ok[None, :])


@triton.jit
def combine_kernel(y_ptr, ids_ptr, out_ptr, H, offset, E, stride_y, stride_o,
                    TOPK: tl.constexpr, BH: tl.constexpr):
    """out[t] = sum over t's local routes j (in order) of y[t * TOPK + j] (fp32), every row written."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    ok = cols < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + j).to(tl.int32) - offset
        if (e >= 0) & (e < E):
            acc += tl.load(y_ptr + (t * TOPK + j) * stride_y + cols, mask=ok, other=0.0)
    tl.store(out_ptr + t * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)
