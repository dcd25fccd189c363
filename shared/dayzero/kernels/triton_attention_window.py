"""Triton sliding-window prefill attention with sinks: one tile, no key loop (window <= 256).

A tile is ``TOK`` consecutive new tokens of one sequence x the ``GROUP`` query heads that share one
KV head (rows = TOK * GROUP, GQA packing). Every key the tile may see lies in
``[p0 - window + 1, p0 + TOK)`` (``p0``: position of the tile's first token), so a program loads
  * block A: the ``WIN_N`` keys just before ``p0`` (WIN_N = window rounded up to a power of two),
    masked by ``query - key < window``; and
  * block B: the ``TOK`` keys of the tile itself (padded to ``TOK_N`` >= 16), masked causally,
computes both score blocks, takes the row max over both and the sink, exponentiates once, does two
PV products and writes the output. No online rescale, no key loop, no pipeline fill: the latency
is hidden by many small programs per SM. ``TILES`` > 1 makes a program walk that many consecutive
tiles of one KV head (a persistent-ish variant whose loop Triton may pipeline).
Keys of block A before the sequence's ``cached_len`` are gathered from the paged cache through the
block table (chunked prefill); positions below the window or before the sequence start are never
loaded (the engine may point those table entries anywhere). Tiles never straddle sequences.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_attention_prefill import LOG2E

MAX_WINDOW = 256  # block A of WIN_N keys stays in registers up to this size


@triton.jit
def _window_tile(q_ptr, k_new, v_new, kc_head, vc_head, bt_row, sink_ptr, o_ptr,
                 q_start, q_len, ctx, t0, hkv,
                 stride_qt, stride_qh, stride_kt, stride_vt,
                 stride_kcb, stride_kct, stride_vcb, stride_vct, stride_ot, stride_oh,
                 qk_scale, window,
                 GROUP: tl.constexpr, TOK: tl.constexpr, TOK_N: tl.constexpr, WIN_N: tl.constexpr,
                 BS: tl.constexpr, HEAD_D: tl.constexpr):
    R: tl.constexpr = TOK * GROUP
    offs_r = tl.arange(0, R)
    offs_d = tl.arange(0, HEAD_D)
    tok = t0 + offs_r // GROUP                                    # [R] new-token index of each row
    head = hkv * GROUP + offs_r % GROUP                           # [R] query head of each row
    row_ok = tok < q_len
    rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)                  # [R, D]
    p0 = ctx + t0
    q_pos = p0 + offs_r // GROUP                                  # [R] absolute query position

    # ---- block A: positions [p0 - WIN_N, p0); visible to some row only from lo on ----
    offs_a = tl.arange(0, WIN_N)
    pos_a = p0 - WIN_N + offs_a                                   # [WN]
    lo = tl.maximum(p0 - window + 1, 0)
    ok_a = pos_a >= lo
    idx_a = (pos_a - ctx).to(tl.int64)                            # new-key index (< 0: in the cache)
    if lo < ctx:
        # part of the window is in the paged cache: gather those keys through the block table
        in_c = ok_a & (pos_a < ctx)
        in_n = ok_a & (pos_a >= ctx)
        blk = tl.load(bt_row + pos_a // BS, mask=in_c, other=0).to(tl.int64)
        slot = (pos_a % BS).to(tl.int64)
        kc = tl.load(kc_head + (blk * stride_kcb + slot * stride_kct)[:, None] + offs_d[None, :],
                     mask=in_c[:, None], other=0.0)
        vc = tl.load(vc_head + (blk * stride_vcb + slot * stride_vct)[:, None] + offs_d[None, :],
                     mask=in_c[:, None], other=0.0)
        kn = tl.load(k_new + idx_a[:, None] * stride_kt + offs_d[None, :], mask=in_n[:, None], other=0.0)
        vn = tl.load(v_new + idx_a[:, None] * stride_vt + offs_d[None, :], mask=in_n[:, None], other=0.0)
        ka = tl.where(in_c[:, None], kc, kn)                      # [WN, D]
        va = tl.where(in_c[:, None], vc, vn)
    else:
        ka = tl.load(k_new + idx_a[:, None] * stride_kt + offs_d[None, :], mask=ok_a[:, None], other=0.0)
        va = tl.load(v_new + idx_a[:, None] * stride_vt + offs_d[None, :], mask=ok_a[:, None], other=0.0)

    # ---- block B: the tile's own keys, new-key indices [t0, t0 + TOK) ----
    offs_b = tl.arange(0, TOK_N)
    idx_b = t0 + offs_b
    ok_b = (offs_b < TOK) & (idx_b < q_len)
    idx_b64 = idx_b.to(tl.int64)
    kb = tl.load(k_new + idx_b64[:, None] * stride_kt + offs_d[None, :], mask=ok_b[:, None], other=0.0)
    vb = tl.load(v_new + idx_b64[:, None] * stride_vt + offs_d[None, :], mask=ok_b[:, None], other=0.0)
    pos_b = p0 + offs_b

    sa = tl.dot(q, tl.trans(ka)) * qk_scale                       # [R, WN] (base-2 logits)
    vis_a = ok_a[None, :] & ((q_pos[:, None] - pos_a[None, :]) < window)
    sa = tl.where(vis_a, sa, float("-inf"))
    sb = tl.dot(q, tl.trans(kb)) * qk_scale                       # [R, TN]
    vis_b = ok_b[None, :] & (pos_b[None, :] <= q_pos[:, None]) & ((q_pos[:, None] - pos_b[None, :]) < window)
    sb = tl.where(vis_b, sb, float("-inf"))
    sink = tl.load(sink_ptr + head).to(tl.float32) * 1.4426950408889634            # [R]
    m = tl.maximum(tl.maximum(tl.max(sa, 1), tl.max(sb, 1)), sink)                  # finite: sink is
    pa = tl.math.exp2(sa - m[:, None])
    pb = tl.math.exp2(sb - m[:, None])
    l_i = tl.sum(pa, 1) + tl.sum(pb, 1) + tl.math.exp2(sink - m)
    acc = tl.dot(pa.to(va.dtype), va)                             # [R, D]
    acc = tl.dot(pb.to(vb.dtype), vb, acc)
    out = acc / l_i[:, None]
    tl.store(o_ptr + rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _window_kernel(q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, cl_ptr, sink_ptr, o_ptr,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                   stride_bt, stride_ot, stride_oh, qk_scale, window,
                   GROUP: tl.constexpr, TOK: tl.constexpr, TOK_N: tl.constexpr, WIN_N: tl.constexpr,
                   TILES: tl.constexpr, BS: tl.constexpr, HEAD_D: tl.constexpr):
    pid = tl.program_id(0)
    hkv = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(cu_ptr + b).to(tl.int64)
    q_len = tl.load(cu_ptr + b + 1) - q_start.to(tl.int32)
    t_first = pid * (TILES * TOK)
    if t_first >= q_len:
        return
    ctx = tl.load(cl_ptr + b)
    k_new = k_ptr + q_start * stride_kt + hkv * stride_kh         # row n = new key n of this sequence
    v_new = v_ptr + q_start * stride_vt + hkv * stride_vh
    kc_head = kc_ptr + hkv * stride_kch
    vc_head = vc_ptr + hkv * stride_vch
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    if TILES == 1:
        _window_tile(q_ptr, k_new, v_new, kc_head, vc_head, bt_row, sink_ptr, o_ptr,
                     q_start, q_len, ctx, t_first, hkv, stride_qt, stride_qh, stride_kt, stride_vt,
                     stride_kcb, stride_kct, stride_vcb, stride_vct, stride_ot, stride_oh, qk_scale, window,
                     GROUP, TOK, TOK_N, WIN_N, BS, HEAD_D)
    else:
        n_tiles = tl.minimum(TILES, tl.cdiv(q_len - t_first, TOK))
        for i in range(0, n_tiles):
            _window_tile(q_ptr, k_new, v_new, kc_head, vc_head, bt_row, sink_ptr, o_ptr,
                         q_start, q_len, ctx, t_first + i * TOK, hkv, stride_qt, stride_qh, stride_kt,
                         stride_vt, stride_kcb, stride_kct, stride_vcb, stride_vct, stride_ot, stride_oh,
                         qk_scale, window, GROUP, TOK, TOK_N, WIN_N, BS, HEAD_D)


def default_window_config(head_dim: int, group: int) -> dict:
    """Rows per tile and launch parameters of the window kernel (see bench/NOTES.md)."""
    return dict(ROWS=128, TILES=1, num_warps=8, num_stages=1)


def window_supported(window: int, group: int) -> bool:
    """The loop-free kernel needs block A in registers and a power-of-two GQA group."""
    return 0 < window <= MAX_WINDOW and group & (group - 1) == 0


def window_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                     scale: float, window: int, max_seqlen_q: int, out: torch.Tensor,
                     config: dict | None = None) -> torch.Tensor:
    """Launch the loop-free window kernel; ``max_seqlen_q`` sizes the grid (no device sync here)."""
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    B = cached_lens.shape[0]
    group = Hq // Hkv
    if not window_supported(window, group):
        raise ValueError(f"window kernel: window {window} must be in [1, {MAX_WINDOW}] and the GQA "
                         f"group {group} a power of two")
    cfg = dict(default_window_config(D, group))
    cfg.update(config or {})
    cfg.pop("KERNEL", None)
    rows, tiles = cfg.pop("ROWS"), cfg.pop("TILES")
    tok = max(1, rows // group)
    if tok * group < 16:
        tok = 16 // group
    if T == 0 or max_seqlen_q == 0:
        return out
    grid = (triton.cdiv(max_seqlen_q, tok * tiles), Hkv, B)
    _window_kernel[grid](
        q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), scale * LOG2E, window,
        GROUP=group, TOK=tok, TOK_N=max(16, triton.next_power_of_2(tok)),
        WIN_N=max(16, triton.next_power_of_2(window)), TILES=tiles, BS=k_cache.shape[1], HEAD_D=D, **cfg)
    return out
