"""Triton kernels of the split-K decode MoE (``triton_moe_small_split`` launches them).

Program = (slot, N tile, K split); the K splits of one tile sit on neighbouring program ids. A slot
is one touched local expert (``triton_moe_small_route``: from plan tables, or the leading pair of
that expert at small T * k); its tokens (at most BM per chunk) are the M side of the dot.
  1. ``gate_up_kernel``: acc [BM, BN] over the program's K range. SPLIT = 1: epilogue right away
     (``+ b1``, bf16 rounding like the reference, clamped SwiGLU on interleaved gate/up columns) ->
     h [P, I] in fp16 with ``H16`` (|h| <= 8 * limit fits) else bf16. SPLIT > 1: the fp32 partial goes
     to ws [SPLIT, P, 2I] (plain stores), then a ticket per (slot, N tile); the program drawing the
     last ticket sums the partials in split order (deterministic whatever the arrival order), runs
     the epilogue and resets the ticket.
  2. ``down_kernel``: y [SPLIT, P, H] fp32 = partial of (acc + b2) * routing weight (bias in split 0);
     fp16 dot with ``H16`` (e4m3 -> f16 is one instruction per two weights; e4m3 -> bf16 needs one
     more per weight and register moves). ``FUSE``: a ticket per N tile counts (touched slots x
     SPLIT) arrivals; the last program sums y over each token's local routes, then splits (fixed
     order) and writes out [T, H] (tokens without a local route: zeros): no combine launch.
  3. else ``combine_kernel`` does that sum.
The K loop is bound by instructions per weight byte (run 3: ~209 per warp and 128-wide step at
BN = 32), so full K blocks load weights without masks and block scales are loaded one step ahead;
A rows past an expert's token count stay masked (no bytes moved for them).
Options of the run-10 candidates (``SplitTiles`` row_scales / vec_combine / ids_once; off in the shipped
tiles): ``SK`` > 0 loads a program's block scales once before the K loop, ``KP`` > 0 combines with
``_combine_rows``, ``IDS1`` finds leader slots and rows from one load of the pair ids.
``PDL`` (fused calls): gate_up lets the down grid launch early; down finds its slot, then waits for
gate_up before reading h or storing anything (``triton_moe_small_pdl``).
Tickets live between calls (``experts.derived``): zero before the first call, reset by their last
user. Weights FP8 [E, N, K] with 128x128 block scales [E, ceil(N/128), ceil(K/128)] (BN divides 128);
activations bf16, widened weights, fp32 accumulation. No host syncs: CUDA-graph capturable.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_gemv import _fence_gpu, pow2_row_scales
from .triton_moe_small_pdl import trigger, wait
from .triton_moe_small_route import (_chunk_end, _local_ids, _rows, _rows_of, _slot, _slot_of, _touched,
                                     _touched_of)
from .triton_swiglu import clamped_swiglu


@triton.jit
def _program(pid, n_tiles, K, SPLIT: tl.constexpr, BK_: tl.constexpr):
    """pid -> (slot, N tile, K split, first K block, end K block)."""
    ks = pid % SPLIT
    pid_n = (pid // SPLIT) % n_tiles
    s = pid // (SPLIT * n_tiles)
    nkb = tl.cdiv(K, BK_)
    per = tl.cdiv(nkb, SPLIT)
    kb0 = ks * per
    return s, pid_n, ks, kb0, tl.minimum(kb0 + per, nkb)


@triton.jit
def _step(acc, a_ptrs, row_ok, b_ptrs, k, sb, k_ok, n_ok, MASK_K: tl.constexpr, EVEN_N: tl.constexpr,
          A16: tl.constexpr, DOT_F32: tl.constexpr, X16: tl.constexpr = False):
    """acc + (A[:, k : k+BK] @ fp8 tile[k : k+BK, :]) * sb. A rows past the expert's token count are
    masked (zero-filled copies move no bytes: run 4 loaded them unmasked, 16x the A bytes at T = 1);
    weights are masked only at the K and N tails."""
    if MASK_K:
        a = tl.load(a_ptrs + k, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if EVEN_N:
            b = tl.load(b_ptrs + k, mask=k_ok[:, None], other=0.0)
        else:
            b = tl.load(b_ptrs + k, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
    else:
        a = tl.load(a_ptrs + k, mask=row_ok[:, None], other=0.0)
        if EVEN_N:
            b = tl.load(b_ptrs + k)
        else:
            b = tl.load(b_ptrs + k, mask=n_ok[None, :], other=0.0)
    if X16:  # bf16 A rows through power-of-two scales into fp16 (exact), so the weights widen to fp16: one F2FP
        # per two (to bf16: two quarter-rate F2F more each; opt-in ``SplitTiles.x16``, bench/NOTES.md session 7)
        r, inv = pow2_row_scales(a)
        ah = (a.to(tl.float32) * r[:, None]).to(tl.float16)
        if DOT_F32:
            d = tl.dot(ah.to(tl.float32), b.to(tl.float32))
        else:
            d = tl.dot(ah, b.to(tl.float16))
        return acc + d * (inv[:, None] * sb)
    elif DOT_F32:  # the CPU interpreter mis-multiplies bf16 dots
        return acc + tl.dot(a.to(tl.float32), b.to(tl.float32)) * sb
    elif A16:    # fp16 operands: e4m3 -> f16 is one instruction per two weights (bf16 needs one more each)
        return acc + tl.dot(a, b.to(tl.float16)) * sb
    else:
        return acc + tl.dot(a, b.to(tl.bfloat16)) * sb


@triton.jit
def _stream(a_ptrs, row_ok, b_ptrs, s_ptr, n_ok, K, kb0, kb1, BM: tl.constexpr, BN: tl.constexpr, BK_: tl.constexpr,
            EVEN_N: tl.constexpr, A16: tl.constexpr, DOT_F32: tl.constexpr, SK: tl.constexpr = 0,
            X16: tl.constexpr = False):
    """acc [BM, BN] = A[:, kb0*BK_ : kb1*BK_] @ dequant(fp8 tile)^T over the same K range: full
    128-wide blocks without masks, then the partial last block of K where the range holds it.
    Block scales: ``SK`` = 0: one step ahead (sm_90 SASS: the register move that carries the next
    step's scale into the loop waits for its load, so every K step waits one L2 round trip whatever
    the pipeline depth); ``SK`` > 0 (a power of two >= kb1 - kb0): the range's scales are loaded once
    before the loop into a [SK] row and each step picks its own (no global load inside the loop)."""
    offs_k = tl.arange(0, BK_)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    kfull = tl.minimum(kb1, K // BK_)
    if SK > 0:
        si = tl.arange(0, SK)
        srow = tl.load(s_ptr + kb0 + si, mask=kb0 + si < kb1, other=0.0)
        for kb in range(kb0, kfull):
            sb = tl.sum(tl.where(si == kb - kb0, srow, 0.0), 0)
            acc = _step(acc, a_ptrs, row_ok, b_ptrs, kb * BK_, sb, offs_k, n_ok, False, EVEN_N, A16, DOT_F32, X16)
        sb = tl.sum(tl.where(si == kfull - kb0, srow, 0.0), 0)
    else:
        # block scales one step ahead (a scalar load is not pipelined by the compiler: loaded in the
        # step that uses it, it would cost an L2 round trip per step)
        sb = tl.load(s_ptr + kb0, mask=kb0 < kb1, other=0.0)
        for kb in range(kb0, kfull):
            sn = tl.load(s_ptr + kb + 1, mask=kb + 1 < kb1, other=0.0)
            acc = _step(acc, a_ptrs, row_ok, b_ptrs, kb * BK_, sb, offs_k, n_ok, False, EVEN_N, A16, DOT_F32, X16)
            sb = sn
    if kfull < kb1:
        acc = _step(acc, a_ptrs, row_ok, b_ptrs, kfull * BK_, sb, offs_k < K - kfull * BK_, n_ok, True, EVEN_N, A16,
                    DOT_F32, X16)
    return acc


@triton.jit
def _ticket(ticket_ptr, like, DOT_F32: tl.constexpr):
    """Draw a ticket after this program's stores (made visible GPU-wide first)."""
    if not DOT_F32:  # (the CPU interpreter runs programs one by one and has no inline asm)
        _fence_gpu(like)
    tl.debug_barrier()
    return tl.atomic_add(ticket_ptr, 1, sem="acq_rel")


@triton.jit
def _swiglu_store(v, bias, h_ptr, pair, row_ok, pid_n, N, stride_h, limit, alpha,
                  BM: tl.constexpr, BN: tl.constexpr):
    """h[pair, tile's I columns] = clamped SwiGLU of bf16(v + b1) (gate even, up odd columns)."""
    v = (v + bias[None, :]).to(tl.bfloat16).to(tl.float32)
    gate, up = tl.split(tl.reshape(v, (BM, BN // 2, 2)))
    h = clamped_swiglu(gate, up, limit, alpha)
    offs_h = pid_n * (BN // 2) + tl.arange(0, BN // 2)
    tl.store(h_ptr + pair.to(tl.int64)[:, None] * stride_h + offs_h[None, :], h.to(h_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_h < N // 2)[None, :])


@triton.jit
def gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, h_ptr, ws_ptr, ticket_ptr, slot_e_ptr, slot_cnt_ptr,
                   slot_pairs_ptr, K, N, n_tiles, P, offset, E, stride_x, stride_we, stride_wn, stride_se,
                   stride_sn, stride_be, stride_h, limit, alpha,
                   TOPK: tl.constexpr, TB: tl.constexpr, PB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK_: tl.constexpr, SPLIT: tl.constexpr, EVEN_N: tl.constexpr, H16: tl.constexpr,
                   PLAN: tl.constexpr, ONE_CHUNK: tl.constexpr, DOT_F32: tl.constexpr, SK: tl.constexpr = 0,
                   IDS1: tl.constexpr = False, PDL: tl.constexpr = False, X16: tl.constexpr = False):
    trigger(PDL)   # the down grid (launch_pdl) may start; it waits for this grid before reading h
    s, pid_n, ks, kb0, kb1 = _program(tl.program_id(0), n_tiles, K, SPLIT, BK_)
    if IDS1:  # leader slots (not PLAN) from one load of the pair ids (``triton_moe_small_route``)
        q, idq = _local_ids(ids_ptr, P, offset, PB)
        e, cnt = _slot_of(q, idq, s, P, E, PB)
    else:
        e, cnt = _slot(ids_ptr, slot_e_ptr, slot_cnt_ptr, s, P, offset, E, PB, PLAN)
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
    for c in range(0, _chunk_end(cnt, ONE_CHUNK), BM):
        if IDS1:
            pair, row_ok = _rows_of(q, idq, e, cnt, c, P, BM)
        else:
            pair, row_ok = _rows(ids_ptr, slot_pairs_ptr, s, e, cnt, c, P, offset, TB, BM, PB, PLAN)
        a_ptrs = x_ptr + (pair // TOPK).to(tl.int64)[:, None] * stride_x + offs_k[None, :]
        acc = _stream(a_ptrs, row_ok, b_ptrs, sc_ptr, n_ok, K, kb0, kb1, BM, BN, BK_, EVEN_N, False, DOT_F32, SK, X16)
        if SPLIT == 1:
            _swiglu_store(acc, bias, h_ptr, pair, row_ok, pid_n, N, stride_h, limit, alpha, BM, BN)
        else:
            tl.store(ws_ptr + (ks * P + pair).to(tl.int64)[:, None] * N + offs_n[None, :], acc,
                     mask=row_ok[:, None] & n_ok[None, :])
    if SPLIT > 1:
        tp = ticket_ptr + s * n_tiles + pid_n
        if _ticket(tp, offs_k, DOT_F32) == SPLIT - 1:  # last split of the tile: sum in split order
            for c in range(0, _chunk_end(cnt, ONE_CHUNK), BM):
                pair, row_ok = _rows(ids_ptr, slot_pairs_ptr, s, e, cnt, c, P, offset, TB, BM, PB, PLAN)
                tot = tl.zeros((BM, BN), dtype=tl.float32)
                for j in tl.static_range(SPLIT):
                    tot += tl.load(ws_ptr + (j * P + pair).to(tl.int64)[:, None] * N + offs_n[None, :],
                                   mask=row_ok[:, None] & n_ok[None, :], other=0.0, cache_modifier=".cg")
                _swiglu_store(tot, bias, h_ptr, pair, row_ok, pid_n, N, stride_h, limit, alpha, BM, BN)
            tl.atomic_xchg(tp, 0, sem="relaxed")


@triton.jit
def _combine_tile(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, offs_n, n_ok,
                  TOPK: tl.constexpr, SPLIT: tl.constexpr, BN: tl.constexpr):
    """out[t, tile] = sum over t's local routes j, then splits, of y[s, t * TOPK + j, tile] (every t)."""
    for t in range(0, T):
        acc = tl.zeros((BN,), dtype=tl.float32)
        for j in tl.static_range(TOPK):
            ej = tl.load(ids_ptr + t * TOPK + j).to(tl.int32) - offset
            if (ej >= 0) & (ej < E):
                for sp in tl.static_range(SPLIT):
                    acc += tl.load(y_ptr + (sp * P + t * TOPK + j) * N + offs_n, mask=n_ok,
                                   other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + t * stride_o + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _combine_rows(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, offs_n, n_ok,
                  TOPK: tl.constexpr, SPLIT: tl.constexpr, BN: tl.constexpr, KP: tl.constexpr):
    """``_combine_tile`` with one load of a token's k ids and one [KP, BN] load of its y rows per split
    (two L2 round trips per token; ``_combine_tile`` chains an ids load and a y load per route, 2k
    round trips on the last program's tail). Sums routes as a tree (fixed order: repeatable)."""
    j = tl.arange(0, KP)
    for t in range(0, T):
        ej = tl.load(ids_ptr + t * TOPK + j, mask=j < TOPK, other=-1).to(tl.int32) - offset
        ok = (j < TOPK) & (ej >= 0) & (ej < E)
        acc = tl.zeros((BN,), dtype=tl.float32)
        for sp in tl.static_range(SPLIT):
            v = tl.load(y_ptr + ((sp * P + t * TOPK + j) * N)[:, None] + offs_n[None, :],
                        mask=ok[:, None] & n_ok[None, :], other=0.0, cache_modifier=".cg")
            acc += tl.sum(v, 0)
        tl.store(out_ptr + t * stride_o + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _combine(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, offs_n, n_ok,
             TOPK: tl.constexpr, SPLIT: tl.constexpr, BN: tl.constexpr, KP: tl.constexpr):
    """``_combine_rows`` when ``KP`` > 0 (a power of two >= TOPK), else ``_combine_tile``."""
    if KP > 0:
        _combine_rows(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, offs_n, n_ok, TOPK, SPLIT, BN, KP)
    else:
        _combine_tile(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, offs_n, n_ok, TOPK, SPLIT, BN)


@triton.jit
def down_kernel(h_ptr, ids_ptr, wt_ptr, w_ptr, s_ptr, b_ptr, y_ptr, out_ptr, ticket_ptr, slot_e_ptr, slot_cnt_ptr,
                slot_pairs_ptr, T, K, N, n_tiles, P, offset, E, n_slots, stride_h, stride_we, stride_wn, stride_se,
                stride_sn, stride_be, stride_o,
                TOPK: tl.constexpr, TB: tl.constexpr, PB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BK_: tl.constexpr, SPLIT: tl.constexpr, EVEN_N: tl.constexpr, H16: tl.constexpr, PLAN: tl.constexpr,
                FUSE: tl.constexpr, ONE_CHUNK: tl.constexpr, DOT_F32: tl.constexpr, SK: tl.constexpr = 0,
                KP: tl.constexpr = 0, IDS1: tl.constexpr = False, PDL: tl.constexpr = False):
    s, pid_n, ks, kb0, kb1 = _program(tl.program_id(0), n_tiles, K, SPLIT, BK_)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    offs_nc = tl.where(n_ok, offs_n, 0)
    if IDS1:  # leader slots (not PLAN) from one load of the pair ids (``triton_moe_small_route``)
        q, idq = _local_ids(ids_ptr, P, offset, PB)
    if FUSE:
        if IDS1:
            touched = _touched_of(q, idq, P, E)
        else:
            touched = _touched(ids_ptr, slot_e_ptr, n_slots, P, offset, E, PB, PLAN)
        if touched == 0:  # no route to this rank: nobody draws a ticket, one program writes zeros
            if (s == 0) & (ks == 0):
                wait(PDL)
                _combine(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, offs_n, n_ok, TOPK, SPLIT, BN, KP)
            return
    if IDS1:
        e, cnt = _slot_of(q, idq, s, P, E, PB)
    else:
        e, cnt = _slot(ids_ptr, slot_e_ptr, slot_cnt_ptr, s, P, offset, E, PB, PLAN)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    offs_k = tl.arange(0, BK_)
    b_ptrs = w_ptr + e64 * stride_we + offs_nc[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    sc_ptr = s_ptr + e64 * stride_se + ((pid_n * BN) // 128) * stride_sn
    bias = tl.load(b_ptr + e64 * stride_be + offs_nc, mask=n_ok & (ks == 0), other=0.0).to(tl.float32)
    wait(PDL)   # gate_up complete (h visible) before the first h load or global store
    for c in range(0, _chunk_end(cnt, ONE_CHUNK), BM):
        if IDS1:
            pair, row_ok = _rows_of(q, idq, e, cnt, c, P, BM)
        else:
            pair, row_ok = _rows(ids_ptr, slot_pairs_ptr, s, e, cnt, c, P, offset, TB, BM, PB, PLAN)
        a_ptrs = h_ptr + pair.to(tl.int64)[:, None] * stride_h + offs_k[None, :]
        acc = _stream(a_ptrs, row_ok, b_ptrs, sc_ptr, n_ok, K, kb0, kb1, BM, BN, BK_, EVEN_N, H16, DOT_F32, SK)
        wt = tl.load(wt_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
        y = (acc + bias[None, :]) * wt[:, None]
        tl.store(y_ptr + (ks * P + pair).to(tl.int64)[:, None] * N + offs_n[None, :], y,
                 mask=row_ok[:, None] & n_ok[None, :])
    if FUSE:
        if _ticket(ticket_ptr + pid_n, offs_k, DOT_F32) == touched * SPLIT - 1:
            _combine(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, offs_n, n_ok, TOPK, SPLIT, BN, KP)
            tl.atomic_xchg(ticket_ptr + pid_n, 0, sem="relaxed")


@triton.jit
def combine_kernel(y_ptr, ids_ptr, out_ptr, H, P, offset, E, stride_o,
                   TOPK: tl.constexpr, SPLIT: tl.constexpr, BH: tl.constexpr):
    """out[t] = sum over t's local routes j (in order), then splits, of y[s, t * TOPK + j]; every row written."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    ok = cols < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + j).to(tl.int32) - offset
        if (e >= 0) & (e < E):
            for sp in tl.static_range(SPLIT):
                acc += tl.load(y_ptr + (sp * P + t * TOPK + j) * H + cols, mask=ok, other=0.0)
    tl.store(out_ptr + t * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)
