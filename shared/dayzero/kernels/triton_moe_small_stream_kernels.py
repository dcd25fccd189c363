"""Triton kernels of the persistent ("stream") decode MoE (``triton_moe_small_stream`` launches them).

Why: in the split-K path (``triton_moe_small_split_kernels``) at T = 1 each program streams only 3-8
K blocks between a prologue of dependent loads (ids, leader scan) and a ticket epilogue (fence +
atomic), 3-4 waves of them per GEMM: gate_up moved 66 MB at ~1.7 TB/s whatever the tile (run 5).
Here a fixed grid of G programs (a few per SM) splits the flattened work list

    w = (slot * n_tiles + N tile) * nkb + K block,   slot < touched (distinct local experts)

into G contiguous ranges of ``per = cdiv(W, G)`` K blocks. A program pays one prologue, then walks
the (at most a few) tiles its range crosses, each a pipelined K loop (``_stream``). A tile whose
whole K range lies in one program gets its epilogue right away; else each covering program stores
its fp32 partial to ws[j] (j = program - first program of the tile) and draws the tile's ticket; the
last one sums the partials in j order (deterministic whatever the arrival order) and runs the
epilogue. The number of programs covering a tile follows from ``per``, so nothing is counted twice.
  * ``gate_up_stream_kernel``: epilogue = ``+ b1``, clamped SwiGLU -> h [P, I] (fp16 with ``H16``).
  * ``down_stream_kernel``: epilogue = ``(acc + b2) * routing weight`` -> y [P, H] fp32, then a ticket
    per N tile counts finished slots; the last sums each token's local routes in route order (the
    combine) and writes out [T, H]. No route on this rank: the programs write zeros.
Slots are the leading pairs of each local expert (pair order), found in-kernel from the <= PB ids:
the path is for T <= BM (every expert's tokens fit one M block). Tickets live between calls
(``experts.derived``), zero before the first call, reset by their last user: CUDA-graph safe.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_moe_small_route import _local_ids, _rows
from .triton_moe_small_split_kernels import _combine_tile, _stream, _swiglu_store, _ticket


@triton.jit
def _leaders(ids_ptr, P, offset, E, PB: tl.constexpr):
    """(local id per pair [PB], leader mask [PB], slot rank of each leader [PB], touched): a leader is
    the first pair routed to its local expert; slot s = the s-th leader in pair order."""
    q, idq = _local_ids(ids_ptr, P, offset, PB)
    idr = tl.load(ids_ptr + q, mask=q < P, other=-1).to(tl.int32) - offset   # same ids, row side
    earlier = (q[None, :] < q[:, None]) & (idq[None, :] == idr[:, None])      # [PB, PB]
    lead = (q < P) & (idr >= 0) & (idr < E) & (tl.sum(earlier.to(tl.int32), 1) == 0)
    rank = tl.cumsum(lead.to(tl.int32), 0) - 1
    return idr, lead, rank, tl.sum(lead.to(tl.int32), 0)


@triton.jit
def _range(n_tiles, K, touched, BK_: tl.constexpr):
    """This program's K blocks [w0, w1) of the flattened list, its tiles [t0, t1], per, nkb."""
    nkb = tl.cdiv(K, BK_)
    W = touched * n_tiles * nkb
    per = tl.cdiv(W, tl.num_programs(0))
    w0 = tl.program_id(0) * per
    w1 = tl.minimum(w0 + per, W)
    t0 = w0 // nkb
    return w0, w1, t0, tl.where(w1 > w0, (w1 - 1) // nkb, t0 - 1), per, nkb   # (no work: no tile)


@triton.jit
def _segment(tile, w0, w1, nkb, n_tiles, ids_ptr, P, offset, E, PB: tl.constexpr):
    """Tile -> (slot, its local expert, the expert's token count, N tile, this program's K blocks
    [kb0, kb1) of the tile). The leaders are recomputed from the (L1-resident) ids per tile rather
    than kept live across the tile loop (sm_90 compile: +100 registers)."""
    s = tile // n_tiles
    idr, lead, rank, _ = _leaders(ids_ptr, P, offset, E, PB)
    e = tl.sum(tl.where(lead & (rank == s), idr, 0), 0)
    cnt = tl.sum((idr == e).to(tl.int32), 0)   # padding ids are < 0
    kb0 = tl.maximum(w0 - tile * nkb, 0)
    kb1 = tl.minimum(w1 - tile * nkb, nkb)
    return s, e, cnt, tile % n_tiles, kb0, kb1


@triton.jit
def _reduce(ws_ptr, acc, tile, kb0, kb1, nkb, per, pair, row_ok, offs_n, n_ok, ticket_ptr, P, N,
            BM: tl.constexpr, BN: tl.constexpr, DOT_F32: tl.constexpr):
    """(whether this program finishes the tile, the tile's full sum): the whole K range here, or the
    last of its covering programs (partials summed in program order); ticket reset by that one."""
    c0 = (tile * nkb) // per
    n_c = ((tile + 1) * nkb - 1) // per - c0 + 1
    split = (kb0 > 0) | (kb1 < nkb)
    done = ~split
    tot = acc
    if split:
        rows = pair.to(tl.int64)[:, None] * N + offs_n[None, :]
        m = row_ok[:, None] & n_ok[None, :]
        tl.store(ws_ptr + ((tl.program_id(0) - c0) * P).to(tl.int64) * N + rows, acc, mask=m)
        done = _ticket(ticket_ptr + tile, offs_n, DOT_F32) == n_c - 1
        if done:
            tot = tl.zeros((BM, BN), dtype=tl.float32)
            for j in tl.range(0, n_c, num_stages=1):  # not pipelined (a pipelined loop here: +85 registers)
                tot += tl.load(ws_ptr + (j * P).to(tl.int64) * N + rows, mask=m, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed")
    return done, tot


@triton.jit
def gate_up_stream_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, h_ptr, ws_ptr, ticket_ptr, K, N, n_tiles, P,
                          offset, E, stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_h,
                          limit, alpha, TOPK: tl.constexpr, PB: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, BK_: tl.constexpr, EVEN_N: tl.constexpr, DOT_F32: tl.constexpr):
    """h [P, I] = SwiGLU(x[token of pair] @ gate_up[expert]^T + b1) over this program's K-block range."""
    touched = tl.sum(_leaders(ids_ptr, P, offset, E, PB)[1].to(tl.int32), 0)
    w0, w1, t0, t1, per, nkb = _range(n_tiles, K, touched, BK_)
    offs_k = tl.arange(0, BK_)
    for tile in range(t0, t1 + 1):
        s, e, cnt, pid_n, kb0, kb1 = _segment(tile, w0, w1, nkb, n_tiles, ids_ptr, P, offset, E, PB)
        e64 = e.to(tl.int64)
        offs_n = pid_n * BN + tl.arange(0, BN)
        n_ok = offs_n < N
        offs_nc = tl.where(n_ok, offs_n, 0)
        pair, row_ok = _rows(ids_ptr, ids_ptr, s, e, cnt, 0, P, offset, PB, BM, PB, False)
        a_ptrs = x_ptr + (pair // TOPK).to(tl.int64)[:, None] * stride_x + offs_k[None, :]
        b_ptrs = w_ptr + e64 * stride_we + offs_nc[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        sc_ptr = s_ptr + e64 * stride_se + ((pid_n * BN) // 128) * stride_sn
        acc = _stream(a_ptrs, row_ok, b_ptrs, sc_ptr, n_ok, K, kb0, kb1, BM, BN, BK_, EVEN_N, False, DOT_F32)
        done, tot = _reduce(ws_ptr, acc, tile, kb0, kb1, nkb, per, pair, row_ok, offs_n, n_ok, ticket_ptr, P, N,
                            BM, BN, DOT_F32)
        if done:
            bias = tl.load(b_ptr + e64 * stride_be + offs_nc, mask=n_ok, other=0.0).to(tl.float32)
            _swiglu_store(tot, bias, h_ptr, pair, row_ok, pid_n, N, stride_h, limit, alpha, BM, BN)


@triton.jit
def down_stream_kernel(h_ptr, ids_ptr, wt_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, out_ptr, ticket_ptr, T, K, N,
                       n_tiles, P, offset, E, stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_be,
                       stride_o, TOPK: tl.constexpr, PB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK_: tl.constexpr, EVEN_N: tl.constexpr, H16: tl.constexpr, DOT_F32: tl.constexpr):
    """y [P, H] = (h @ down[expert]^T + b2) * routing weight, then out [T, H] = sum of each token's
    local routes (tickets [P * n_tiles] per tile, then [n_tiles] per N tile for the combine)."""
    touched = tl.sum(_leaders(ids_ptr, P, offset, E, PB)[1].to(tl.int32), 0)
    if touched == 0:  # nothing routed to this rank: zeros (the combine of no routes)
        for pid_n in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            offs_n = pid_n * BN + tl.arange(0, BN)
            _combine_tile(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, offs_n, offs_n < N, TOPK, 1, BN)
        return
    w0, w1, t0, t1, per, nkb = _range(n_tiles, K, touched, BK_)
    offs_k = tl.arange(0, BK_)
    comb_ptr = ticket_ptr + P * n_tiles
    for tile in range(t0, t1 + 1):
        s, e, cnt, pid_n, kb0, kb1 = _segment(tile, w0, w1, nkb, n_tiles, ids_ptr, P, offset, E, PB)
        e64 = e.to(tl.int64)
        offs_n = pid_n * BN + tl.arange(0, BN)
        n_ok = offs_n < N
        offs_nc = tl.where(n_ok, offs_n, 0)
        pair, row_ok = _rows(ids_ptr, ids_ptr, s, e, cnt, 0, P, offset, PB, BM, PB, False)
        a_ptrs = h_ptr + pair.to(tl.int64)[:, None] * stride_h + offs_k[None, :]
        b_ptrs = w_ptr + e64 * stride_we + offs_nc[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        sc_ptr = s_ptr + e64 * stride_se + ((pid_n * BN) // 128) * stride_sn
        acc = _stream(a_ptrs, row_ok, b_ptrs, sc_ptr, n_ok, K, kb0, kb1, BM, BN, BK_, EVEN_N, H16, DOT_F32)
        done, tot = _reduce(ws_ptr, acc, tile, kb0, kb1, nkb, per, pair, row_ok, offs_n, n_ok, ticket_ptr, P, N,
                            BM, BN, DOT_F32)
        if done:
            bias = tl.load(b_ptr + e64 * stride_be + offs_nc, mask=n_ok, other=0.0).to(tl.float32)
            wt = tl.load(wt_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
            tl.store(y_ptr + pair.to(tl.int64)[:, None] * N + offs_n[None, :], (tot + bias[None, :]) * wt[:, None],
                     mask=row_ok[:, None] & n_ok[None, :])
            if _ticket(comb_ptr + pid_n, offs_k, DOT_F32) == touched - 1:  # last slot of this N tile: combine
                _combine_tile(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, offs_n, n_ok, TOPK, 1, BN)
                tl.atomic_xchg(comb_ptr + pid_n, 0, sem="relaxed")
