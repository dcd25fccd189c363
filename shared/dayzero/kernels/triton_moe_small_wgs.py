"""Decode MoE at 2-8 tokens on FP8 tensor cores, one program per expert slot (``SplitTiles.wg_slots``).

The ``triton_moe_small_wg`` kernels run one program per (token, expert) pair: two tokens routed to one expert
read its weight tiles twice (at 20B and 8 tokens, 32 pairs over ~25 touched experts). Here a program stands for a
slot (``triton_moe_small_route``: the first pair routed to a local expert) and carries every token routed there,
at most 8 (a token picks an expert once; T <= 8), as the 16 columns of the wgmma's B operand: token c's hi term in
column c, its lo term in column 8 + c. The weight tile [BN, 128] is the A operand as in the wg kernels, so the
weight bytes are read once per call and the dot costs the same for 1 or 8 tokens. Each token has its own scale
(row max / 448 times the program's largest block scale). Down reads h as e4m3 hi + lo rows at the fixed scale
of ``wg_hq`` (required here), gathered per column. Its last program per N tile combines (tickets count the
touched slots x K splits). Same numerics as ``wg_hq`` per token.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_moe_small_pdl import trigger, wait
from .triton_moe_small_route import _local_ids, _rows, _slot, _touched
from .triton_moe_small_split_kernels import _combine_rows, _ticket
from .triton_moe_small_wg import FP8_MAX, _acc_dot, _expert_tiles, _h_scale, _hq, _tma, _weight_tile, _weights
from .triton_swiglu import clamped_swiglu

TS = tl.constexpr(8)   # tokens a slot can carry: B columns 0-7 (hi) and 8-15 (lo)


@triton.jit
def _slot_pairs(ids_ptr, s, P, offset, E, PB: tl.constexpr):
    """(local expert of slot s or -1, pair ids [TS] in token order, valid [TS])."""
    e, cnt = _slot(ids_ptr, ids_ptr, ids_ptr, s, P, offset, E, PB, False)
    pair, ok = _rows(ids_ptr, ids_ptr, s, e, cnt, 0, P, offset, TS, TS, PB, False)
    return e, pair, ok & (e >= 0)


@triton.jit
def _slot_cols(ids_ptr, e, P, offset, PB: tl.constexpr):
    """(pair id, valid) of each of the 16 B columns: column c and 8 + c hold the slot's c-th token (order of
    ``_rows``)."""
    q, idq = _local_ids(ids_ptr, P, offset, PB)
    match = (q < P) & (idq == e)
    rank = tl.cumsum(match.to(tl.int32), 0) - 1
    sel = match[None, :] & (rank[None, :] == (tl.arange(0, 2 * TS) % TS)[:, None])   # [16, PB]
    return tl.sum(tl.where(sel, q[None, :], 0), 1), tl.sum(sel.to(tl.int32), 1) > 0


@triton.jit
def _halves(acc, BN: tl.constexpr):
    """acc [BN, 16] -> (columns 0-7, columns 8-15), each [BN, 8]."""
    a, b = tl.split(tl.permute(tl.reshape(acc, (BN, 2, 8)), (0, 2, 1)))
    return a, b


@triton.jit
def _tokens_tile(v, inv, BK: tl.constexpr):
    """v [TS, BK] * inv [TS] -> B [BK, 16] e4m3: column c hi = e4m3(v[c] * inv[c]), column 8 + c the residual
    e4m3((. - hi) * 16). Joined in fp16 (joins of e4m3 do not build on sm_90), converted once."""
    v = v * inv[:, None]
    hi = v.to(tl.float8e4nv).to(tl.float16)
    lo = ((v - hi.to(tl.float32)) * 16.0).to(tl.float8e4nv).to(tl.float16)
    bt = tl.reshape(tl.permute(tl.join(hi, lo), (2, 0, 1)), (2 * TS, BK))    # [16, BK]: hi rows, then lo rows
    return tl.trans(bt).to(tl.float8e4nv)


@triton.jit
def _slot_dot(w_src, e, row0, x_ptr, xrow, ok, stride_x, s_row, k_lo, k_hi, K, BN: tl.constexpr,
              BK: tl.constexpr, KP: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, HQ: tl.constexpr,
              TMA: tl.constexpr):
    """[BN, 16] fp32 dots of the weight rows [row0, row0 + BN) of expert e over k in [k_lo, k_hi) with the slot's
    tokens (``_row_dot8`` of the wg kernels, 8 tokens wide), one column per token: [BN, TS]. x rows at x_ptr +
    xrow * stride_x (``ok``: valid). ``HQ``: x is h as e4m3, row xrow holding hi at [0, K) and lo at [K, 2K), xrow /
    ok [16] per B column (``_slot_cols``); each step's dot is scaled by its block scale, the caller scales by hs.
    Else x is bf16, xrow / ok [TS]: a scale per token (row max / 448 x the largest block scale) and the block
    scale folded into the token before it is quantized."""
    c = tl.arange(0, 2 * TS)
    acc = tl.zeros((BN, 2 * TS), dtype=tl.float32)
    ws = tl.load(s_row + k_lo // BK, mask=k_lo < k_hi, other=0.0)
    if HQ:
        s = tl.full((TS,), 1.0, tl.float32)
        brow = xrow.to(tl.int64) * stride_x + (c // TS) * K   # [16] row starts: hi of token c % 8, then lo
    else:
        q = tl.arange(0, KP // BK)
        wmax = tl.max(tl.load(s_row + q, mask=q < tl.cdiv(K, BK), other=0.0), 0)
        amax = tl.zeros((TS,), dtype=tl.float32)
        for k0 in range(0, K, BK):
            offs = k0 + tl.arange(0, BK)
            xv = tl.load(x_ptr + xrow.to(tl.int64)[:, None] * stride_x + offs[None, :],
                         mask=ok[:, None] & (offs < K)[None, :], other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(xv), 1))
        s = tl.maximum(amax, 1e-30) / FP8_MAX * wmax
        inv = 1.0 / s
        offs = k_lo + tl.arange(0, BK)
        v = tl.load(x_ptr + xrow.to(tl.int64)[:, None] * stride_x + offs[None, :],
                    mask=ok[:, None] & (offs < K)[None, :], other=0.0).to(tl.float32)
    for k in range(k_lo, k_hi, BK):
        w = _weight_tile(w_src, e, row0, k, K, BN, BK, EVEN_K, TMA)
        if HQ:
            offs = k + tl.arange(0, BK)
            b = tl.trans(tl.load(x_ptr + brow[:, None] + offs[None, :], mask=ok[:, None] & (offs < K)[None, :],
                                 other=0.0))
        else:
            b = _tokens_tile(v * ws, inv, BK)
            offs = k + BK + tl.arange(0, BK)   # next step's tokens (past K: zeros, no bytes)
            v = tl.load(x_ptr + xrow.to(tl.int64)[:, None] * stride_x + offs[None, :],
                        mask=ok[:, None] & (offs < K)[None, :], other=0.0).to(tl.float32)
        sc = ws
        ws = tl.load(s_row + (k + BK) // BK, mask=k + BK < k_hi, other=0.0)
        acc = _acc_dot(acc, w, b, sc, DOT_F32, HQ)
    hi, lo = _halves(acc, BN)
    return (hi + lo / 16.0) * s[None, :]   # [BN, TS]: one column per token of the slot


@triton.jit
def wgs_gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, h_ptr, K, N, P, offset, E, stride_x, stride_we,
                       stride_wn, stride_se, stride_sn, stride_be, stride_h, limit, alpha, hs,
                       TOPK: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KP: tl.constexpr, PB: tl.constexpr,
                       EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, TMA: tl.constexpr, PDL: tl.constexpr):
    trigger(PDL)   # the down grid (launch_pdl) may start; it waits for this grid before reading h
    pid = tl.program_id(0)
    s = pid % P
    tile = pid // P
    e, pair, ok = _slot_pairs(ids_ptr, s, P, offset, E, PB)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    rows = tile * BN + tl.arange(0, BN)
    rows_c = tl.where(rows < N, rows, 0)
    w_src, s_row = _expert_tiles(w_ptr, s_ptr, e64, rows_c, tile, stride_we, stride_wn, stride_se, stride_sn, BN, BK,
                                 TMA)
    v = _slot_dot(w_src, e, tile * BN, x_ptr, pair // TOPK, ok, stride_x, s_row, 0, K, K, BN, BK, KP, EVEN_K,
                  DOT_F32, False, TMA)                                                    # [BN, TS]
    v = (v + tl.load(b_ptr + e64 * stride_be + rows_c).to(tl.float32)[:, None]).to(tl.bfloat16).to(tl.float32)
    gate, up = tl.split(tl.permute(tl.reshape(v, (BN // 2, 2, TS)), (0, 2, 1)))          # [BN / 2, TS] each
    t = clamped_swiglu(gate, up, limit, alpha) / hs
    cols = tile * (BN // 2) + tl.arange(0, BN // 2)
    m = (cols < N // 2)[:, None] & ok[None, :]
    q = h_ptr + pair.to(tl.int64)[None, :] * stride_h + cols[:, None]   # h: e4m3 [P, 2I], hi then lo
    hi = t.to(tl.float8e4nv)
    tl.store(q, hi, mask=m)
    tl.store(q + N // 2, ((t - hi.to(tl.float32)) * 16.0).to(tl.float8e4nv), mask=m)


@triton.jit
def wgs_down_kernel(h_ptr, ids_ptr, wt_ptr, w_ptr, s_ptr, b_ptr, y_ptr, out_ptr, ticket_ptr, K, N, n_tiles, T, P,
                    offset, E, stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_o, hs,
                    TOPK: tl.constexpr, PB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KP: tl.constexpr,
                    SPLIT: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, TMA: tl.constexpr,
                    PDL: tl.constexpr, TK: tl.constexpr):
    pid = tl.program_id(0)
    sp = pid % SPLIT
    tile = (pid // SPLIT) % n_tiles
    s = pid // (SPLIT * n_tiles)
    rows = tile * BN + tl.arange(0, BN)
    n_ok = rows < N
    touched = _touched(ids_ptr, ids_ptr, P, P, offset, E, PB, False)   # (ids: written before gate_up started)
    wait(PDL)   # gate_up complete (h visible) before the first h load or any store
    if touched == 0:  # nothing routed to this rank: nobody draws a ticket, one program per tile writes zeros
        if (s == 0) & (sp == 0):
            _combine_rows(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, rows, n_ok, TOPK, SPLIT, BN, TK)
        return
    e, pair, ok = _slot_pairs(ids_ptr, s, P, offset, E, PB)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    rows_c = tl.where(n_ok, rows, 0)
    w_src, s_row = _expert_tiles(w_ptr, s_ptr, e64, rows_c, tile, stride_we, stride_wn, stride_se, stride_sn, BN, BK,
                                 TMA)
    per = tl.cdiv(tl.cdiv(K, BK), SPLIT) * BK
    k_lo = sp * per
    pair16, ok16 = _slot_cols(ids_ptr, e, P, offset, PB)
    acc = _slot_dot(w_src, e, tile * BN, h_ptr, pair16, ok16, stride_h, s_row, k_lo, tl.minimum(k_lo + per, K), K,
                    BN, BK, KP, EVEN_K, DOT_F32, True, TMA) * hs                          # [BN, TS]
    if sp == 0:
        acc += tl.load(b_ptr + e64 * stride_be + rows_c).to(tl.float32)[:, None]
    y = acc * tl.load(wt_ptr + pair, mask=ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + (sp * P + pair.to(tl.int64))[None, :] * N + rows[:, None], y, mask=n_ok[:, None] & ok[None, :])
    if _ticket(ticket_ptr + tile, rows, DOT_F32) == touched * SPLIT - 1:
        _combine_rows(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, rows, n_ok, TOPK, SPLIT, BN, TK)
        tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed")


def check_tiles(t, T: int) -> None:
    """Slots carry up to 8 tokens as hi + lo columns (wg = 2) and hand h over in e4m3 (wg_hq)."""
    if t.bn_gate_up not in (64, 128) or t.bn_down not in (64, 128) or t.wg != 2 or not t.wg_hq or T > 8:
        raise ValueError(f"wg slot tiles need bn_gate_up / bn_down in (64, 128), wg = 2, wg_hq and T <= 8, got "
                         f"{t.bn_gate_up} / {t.bn_down}, {t.wg}, {t.wg_hq}, T = {T}")


def launch_gate_up(run, alpha: float, dot_f32: bool) -> None:
    """gate_up of a ``MoeSplit`` (``run``) on ``wgs_gate_up_kernel``: P * ceil(2I / BN) programs (slot, N tile)."""
    ex, t = run.ex, run.tiles
    check_tiles(t, run.T)
    w, s, b = ex.gate_up, ex.gate_up_scale, ex.gate_up_bias
    h = _hq(run)
    wgs_gate_up_kernel[(run.P * run.nt1,)](
        run.x, run.ids, _weights(w, t.bn_gate_up, _tma(run, w)), s, b, h, run.H, 2 * run.I, run.P, run.offset, run.E,
        run.x.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), b.stride(0), h.stride(0), run.limit,
        alpha, _h_scale(run), TOPK=run.k, BN=t.bn_gate_up, BK=128, KP=triton.next_power_of_2(run.H), PB=run.pb,
        EVEN_K=run.H % 128 == 0, DOT_F32=dot_f32, TMA=_tma(run, w), PDL=run.pdl, num_warps=t.warps,
        num_stages=t.wg_stages)


def launch_down(run, dot_f32: bool) -> None:
    """down + combine of a ``MoeSplit`` on ``wgs_down_kernel``: P * ceil(H / BN) * s2 programs."""
    ex, t = run.ex, run.tiles
    w, s, b = ex.down, ex.down_scale, ex.down_bias
    h = _hq(run)
    wgs_down_kernel[(run.P * run.nt2 * run.s2,)](
        h, run.ids, run.weights, _weights(w, t.bn_down, _tma(run, w)), s, b, run.y, run.out, run.tickets2, run.I,
        run.H, run.nt2, run.T, run.P, run.offset, run.E, h.stride(0), w.stride(0), w.stride(1), s.stride(0),
        s.stride(1), b.stride(0), run.out.stride(0), _h_scale(run), TOPK=run.k, PB=run.pb, BN=t.bn_down, BK=128,
        KP=triton.next_power_of_2(run.I), SPLIT=run.s2, EVEN_K=run.I % 128 == 0, DOT_F32=dot_f32, TMA=_tma(run, w),
        PDL=run.pdl, TK=triton.next_power_of_2(run.k), num_warps=t.warps_down or t.warps, num_stages=t.wg_stages,
        **run._pdl_launch())
