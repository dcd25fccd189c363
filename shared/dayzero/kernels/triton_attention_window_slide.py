"""Sliding-window prefill, "slide" variant: one program walks ``STEPS`` consecutive tiles of one
sequence and KV head, keeping the window's keys/values in registers as a ring.

The loop-free window kernel (triton_attention_window.py) loads, for every tile of ``TOK`` tokens,
the ``WIN_N`` keys before it (block A) again: at TOK 8 that is 32 KB of K/V from L2 per 16 KB of
Q and O. Here block A is gathered once per program (cache or new keys, as there); after each tile
the ``TOK`` keys it just used as block B replace the ring's oldest ``TOK`` slots (a row-masked load
of those rows only), so K/V cross L2 about once per program and only Q, block B and O stream.
Slot ``r`` of the ring holds position ``p0 - WIN_N + ((r - (p0 - p_first)) mod WIN_N)`` for the
tile at position ``p0``; masks use those positions, and the softmax is order-free.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_attention_window import _gather_block_a, _softmax_pv_store


@triton.jit
def _window_slide_kernel(q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, cl_ptr, sink_ptr, o_ptr,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                         stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                         stride_bt, stride_ot, stride_oh, qk_scale, window,
                         GROUP: tl.constexpr, TOK: tl.constexpr, TOK_N: tl.constexpr, WIN_N: tl.constexpr,
                         BS: tl.constexpr, HEAD_D: tl.constexpr, STEPS: tl.constexpr):
    pid = tl.program_id(0)
    hkv = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(cu_ptr + b).to(tl.int64)
    q_len = tl.load(cu_ptr + b + 1) - q_start.to(tl.int32)
    c0 = pid * (TOK * STEPS)
    if c0 >= q_len:
        return
    ctx = tl.load(cl_ptr + b)
    k_new = k_ptr + q_start * stride_kt + hkv * stride_kh         # row n = new key n of this sequence
    v_new = v_ptr + q_start * stride_vt + hkv * stride_vh
    kc_head = kc_ptr + hkv * stride_kch
    vc_head = vc_ptr + hkv * stride_vch
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    R: tl.constexpr = TOK * GROUP
    offs_r = tl.arange(0, R)
    offs_d = tl.arange(0, HEAD_D)
    offs_a = tl.arange(0, WIN_N)
    offs_b = tl.arange(0, TOK_N)
    head = hkv * GROUP + offs_r % GROUP                           # [R] query head of each row
    # block A of the first tile, in natural order (slot r = position p_first - WIN_N + r)
    p_first = ctx + c0
    pos0 = p_first - WIN_N + offs_a
    lo0 = tl.maximum(p_first - window + 1, 0)
    ka, va = _gather_block_a(k_new, v_new, kc_head, vc_head, bt_row, pos0, pos0 >= lo0, lo0, ctx,
                             stride_kt, stride_vt, stride_kcb, stride_kct, stride_vcb, stride_vct, BS, HEAD_D,
                             False)                                # [WN, D] each
    c1 = tl.minimum(c0 + TOK * STEPS, q_len)
    for t0 in range(c0, c1, TOK):
        p0 = ctx + t0
        pos_a = p0 - WIN_N + ((offs_a - (p0 - p_first)) & (WIN_N - 1))   # [WN] position in each slot
        ok_a = pos_a >= tl.maximum(p0 - window + 1, 0)
        tok = t0 + offs_r // GROUP                                # [R] new-token index of each row
        row_ok = tok < q_len
        rows = (q_start + tok).to(tl.int64)
        rows_in = (q_start + tl.minimum(tok, q_len - 1)).to(tl.int64)
        q = tl.load(q_ptr + rows_in[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :])
        q_pos = p0 + offs_r // GROUP
        idx_b = t0 + offs_b                                       # block B: the tile's own keys
        ok_b = (offs_b < TOK) & (idx_b < q_len)
        idx_b64 = tl.minimum(idx_b, q_len - 1).to(tl.int64)
        kb = tl.load(k_new + idx_b64[:, None] * stride_kt + offs_d[None, :])
        vb = tl.load(v_new + idx_b64[:, None] * stride_vt + offs_d[None, :])
        _softmax_pv_store(q, ka, va, kb, vb, pos_a, ok_a, p0 + offs_b, ok_b, q_pos, head, rows, row_ok,
                          sink_ptr, o_ptr, stride_ot, stride_oh, qk_scale, window, HEAD_D, False)
        # slide: this tile's keys [p0, p0 + TOK) replace the oldest TOK slots for the next tile
        pos_n = p0 + TOK - WIN_N + ((offs_a - (p0 + TOK - p_first)) & (WIN_N - 1))
        idx_n = pos_n - ctx                                        # new-key index (>= t0 where inserted)
        ins = (pos_n >= p0) & (idx_n < q_len)
        idx_n64 = tl.where(ins, idx_n, 0).to(tl.int64)
        k_in = tl.load(k_new + idx_n64[:, None] * stride_kt + offs_d[None, :], mask=ins[:, None], other=0.0)
        v_in = tl.load(v_new + idx_n64[:, None] * stride_vt + offs_d[None, :], mask=ins[:, None], other=0.0)
        ka = tl.where(ins[:, None], k_in, ka)
        va = tl.where(ins[:, None], v_in, va)


def launch_window_slide(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                        qk_scale: float, window: int, max_seqlen_q: int, out, group: int, tok: int,
                        win_n: int, steps: int, cfg: dict):
    """Grid: (tiles of TOK * STEPS tokens, Hkv, B); returns triton's compiled kernel."""
    Hkv = k.shape[1]
    B = cached_lens.shape[0]
    return _window_slide_kernel[(triton.cdiv(max_seqlen_q, tok * steps), Hkv, B)](
        q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), qk_scale, window,
        GROUP=group, TOK=tok, TOK_N=max(16, triton.next_power_of_2(tok)), WIN_N=win_n,
        BS=k_cache.shape[1], HEAD_D=q.shape[2], STEPS=steps, **cfg)
