"""Triton sliding-window prefill attention with sinks: one tile, no key loop (window <= 256).

A tile is ``TOK`` consecutive new tokens of one sequence x the ``GROUP`` query heads that share one
KV head (rows = TOK * GROUP, GQA packing). Every key the tile may see lies in
``[p0 - window + 1, p0 + TOK)`` (``p0``: position of the tile's first token), so a program loads
  * block A: the ``WIN_N`` keys just before ``p0`` (WIN_N = window rounded up to a power of two),
    masked by ``query - key < window``; and
  * block B: the ``TOK`` keys of the tile itself (padded to ``TOK_N`` >= 16), masked causally,
computes both score blocks, takes the row max over both and the sink, exponentiates once, does two
PV products and writes the output. No online rescale, no key loop; latency is hidden by several
small programs per SM (~128 registers, 44 KB of shared memory at 64 rows, head dim 64).
One launch (no host sync; ``max_seqlen_q`` sizes the grid). With TMA (prompts of at least
``TMA_MIN_TOKENS`` new tokens), interior tiles (``t0 >= WIN_N``: block A lies in the sequence's new
keys) load block A through the tensor copy engine straight into shared memory; the first ``WIN_N``
tokens of each sequence, and every tile without TMA, load it through row pointers, gathering the
keys before ``cached_len`` from the paged cache (chunked prefill).
Positions below the window or before the sequence start are never loaded (the engine may point
those table entries anywhere). Tiles never straddle sequences.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_attention_prefill import LOG2E, _tma_ok

MAX_WINDOW = 256  # block A of WIN_N keys stays in registers up to this size


@triton.jit
def _softmax_pv_store(q, ka, va, kb, vb, pos_a, ok_a, pos_b, ok_b, q_pos, head, rows, row_ok,
                      sink_ptr, o_ptr, stride_ot, stride_oh, qk_scale, window,
                      HEAD_D: tl.constexpr, ALL_A: tl.constexpr):
    """Both score blocks, one softmax over them and the sink, two PV products, store.
    ``ALL_A``: every block-A key exists (interior tile), only the window mask applies."""
    offs_d = tl.arange(0, HEAD_D)
    sa = tl.dot(q, tl.trans(ka))                                  # [R, WN] raw scores
    if ALL_A:
        vis_a = (q_pos[:, None] - pos_a[None, :]) < window
    else:
        vis_a = ok_a[None, :] & ((q_pos[:, None] - pos_a[None, :]) < window)
    sa = tl.where(vis_a, sa, float("-inf"))
    sb = tl.dot(q, tl.trans(kb))                                  # [R, TN]
    vis_b = ok_b[None, :] & (pos_b[None, :] <= q_pos[:, None]) & ((q_pos[:, None] - pos_b[None, :]) < window)
    sb = tl.where(vis_b, sb, float("-inf"))
    sink = tl.load(sink_ptr + head).to(tl.float32) * 1.4426950408889634            # [R]
    # qk_scale > 0: the max of raw scores, scaled once per row; one FMA per score below
    m = tl.maximum(tl.maximum(tl.max(sa, 1), tl.max(sb, 1)) * qk_scale, sink)      # finite: sink is
    pa = tl.math.exp2(sa * qk_scale - m[:, None])                 # base-2 logits
    pb = tl.math.exp2(sb * qk_scale - m[:, None])
    l_i = tl.sum(pa, 1) + tl.sum(pb, 1) + tl.math.exp2(sink - m)
    acc = tl.dot(pa.to(va.dtype), va)                             # [R, D]
    acc = tl.dot(pb.to(vb.dtype), vb, acc)
    out = acc / l_i[:, None]
    tl.store(o_ptr + rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _gather_block_a(k_new, v_new, kc_head, vc_head, bt_row, pos_a, ok_a, lo, ctx,
                    stride_kt, stride_vt, stride_kcb, stride_kct, stride_vcb, stride_vct,
                    BS: tl.constexpr, HEAD_D: tl.constexpr, BRANCH: tl.constexpr):
    """Block A through row pointers: new keys, or cache slots where the window reaches the cache.
    Two row-masked loads, summed (a masked-off row reads 0); row masks keep 16-byte vectors.
    ``BRANCH``: only tiles whose window reaches the cache do that; the others one masked load."""
    offs_d = tl.arange(0, HEAD_D)
    if BRANCH:
        if lo < ctx:
            ka, va = _two_source_a(k_new, v_new, kc_head, vc_head, bt_row, pos_a, ok_a, ctx,
                                   stride_kt, stride_vt, stride_kcb, stride_kct, stride_vcb, stride_vct,
                                   BS, HEAD_D)
        else:
            idx_a = (pos_a - ctx).to(tl.int64)                    # new-key index
            ka = tl.load(k_new + idx_a[:, None] * stride_kt + offs_d[None, :], mask=ok_a[:, None], other=0.0)
            va = tl.load(v_new + idx_a[:, None] * stride_vt + offs_d[None, :], mask=ok_a[:, None], other=0.0)
    else:
        ka, va = _two_source_a(k_new, v_new, kc_head, vc_head, bt_row, pos_a, ok_a, ctx,
                               stride_kt, stride_vt, stride_kcb, stride_kct, stride_vcb, stride_vct, BS, HEAD_D)
    return ka, va


@triton.jit
def _two_source_a(k_new, v_new, kc_head, vc_head, bt_row, pos_a, ok_a, ctx,
                  stride_kt, stride_vt, stride_kcb, stride_kct, stride_vcb, stride_vct,
                  BS: tl.constexpr, HEAD_D: tl.constexpr):
    offs_d = tl.arange(0, HEAD_D)
    in_c = ok_a & (pos_a < ctx)
    in_n = ok_a & (pos_a >= ctx)
    idx_a = (pos_a - ctx).to(tl.int64)                            # new-key index
    blk = tl.load(bt_row + pos_a // BS, mask=in_c, other=0).to(tl.int64)
    slot = (pos_a % BS).to(tl.int64)
    c_k = blk * stride_kcb + slot * stride_kct                    # [WN] cache offsets
    c_v = blk * stride_vcb + slot * stride_vct
    ka = tl.load(k_new + idx_a[:, None] * stride_kt + offs_d[None, :], mask=in_n[:, None], other=0.0)
    ka += tl.load(kc_head + c_k[:, None] + offs_d[None, :], mask=in_c[:, None], other=0.0)
    va = tl.load(v_new + idx_a[:, None] * stride_vt + offs_d[None, :], mask=in_n[:, None], other=0.0)
    va += tl.load(vc_head + c_v[:, None] + offs_d[None, :], mask=in_c[:, None], other=0.0)
    return ka, va


@triton.jit
def _window_tile(q_ptr, k_new, v_new, k_desc, v_desc, kc_head, vc_head, bt_row, sink_ptr, o_ptr,
                 q_start, q_len, ctx, t0, hkv,
                 stride_qt, stride_qh, stride_kt, stride_vt,
                 stride_kcb, stride_kct, stride_vcb, stride_vct, stride_ot, stride_oh,
                 qk_scale, window,
                 GROUP: tl.constexpr, TOK: tl.constexpr, TOK_N: tl.constexpr, WIN_N: tl.constexpr,
                 BS: tl.constexpr, HEAD_D: tl.constexpr, INTERIOR: tl.constexpr, BRANCH: tl.constexpr):
    # Q and block B rows past the sequence's end are clamped onto its last token (a real, finite
    # row) and dropped by the masks, so those loads need no mask; block A rows outside the window
    # are never read (row-masked loads give 0), so stale cache blocks cannot leak NaN/Inf.
    R: tl.constexpr = TOK * GROUP
    offs_r = tl.arange(0, R)
    offs_d = tl.arange(0, HEAD_D)
    p0 = ctx + t0
    offs_a = tl.arange(0, WIN_N)
    pos_a = p0 - WIN_N + offs_a                                   # [WN] block A: [p0 - WIN_N, p0)
    lo = tl.maximum(p0 - window + 1, 0)                           # first position any row sees
    ok_a = pos_a >= lo
    # block A first (the largest load; with TMA it is issued before the others)
    if INTERIOR:
        # interior tile (t0 >= WIN_N): block A lies in this sequence's new keys; the tensor copy
        # engine puts it straight into shared memory (no register staging)
        ka = k_desc.load([(q_start + t0 - WIN_N).to(tl.int32), hkv * HEAD_D])         # [WN, D]
        va = v_desc.load([(q_start + t0 - WIN_N).to(tl.int32), hkv * HEAD_D])
    else:
        ka, va = _gather_block_a(k_new, v_new, kc_head, vc_head, bt_row, pos_a, ok_a, lo, ctx,
                                 stride_kt, stride_vt, stride_kcb, stride_kct, stride_vcb, stride_vct, BS, HEAD_D,
                                 BRANCH)
    tok = t0 + offs_r // GROUP                                    # [R] new-token index of each row
    head = hkv * GROUP + offs_r % GROUP                           # [R] query head of each row
    row_ok = tok < q_len
    rows = (q_start + tok).to(tl.int64)
    rows_in = (q_start + tl.minimum(tok, q_len - 1)).to(tl.int64)
    q = tl.load(q_ptr + rows_in[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :])  # [R, D]
    q_pos = p0 + offs_r // GROUP                                  # [R] absolute query position
    offs_b = tl.arange(0, TOK_N)
    idx_b = t0 + offs_b                                           # block B: the tile's own keys
    pos_b = p0 + offs_b
    ok_b = (offs_b < TOK) & (idx_b < q_len)
    idx_b64 = tl.minimum(idx_b, q_len - 1).to(tl.int64)
    kb = tl.load(k_new + idx_b64[:, None] * stride_kt + offs_d[None, :])
    vb = tl.load(v_new + idx_b64[:, None] * stride_vt + offs_d[None, :])
    _softmax_pv_store(q, ka, va, kb, vb, pos_a, ok_a, pos_b, ok_b, q_pos, head, rows, row_ok,
                      sink_ptr, o_ptr, stride_ot, stride_oh, qk_scale, window, HEAD_D, INTERIOR)


@triton.jit
def _window_kernel(q_ptr, k_ptr, v_ptr, k_desc, v_desc, kc_ptr, vc_ptr, bt_ptr, cu_ptr, cl_ptr, sink_ptr, o_ptr,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                   stride_bt, stride_ot, stride_oh, qk_scale, window,
                   GROUP: tl.constexpr, TOK: tl.constexpr, TOK_N: tl.constexpr, WIN_N: tl.constexpr,
                   BS: tl.constexpr, HEAD_D: tl.constexpr, TMA: tl.constexpr, BRANCH: tl.constexpr):
    # TMA: interior tiles (t0 >= WIN_N) take block A by TMA, the first WIN_N tokens of a sequence
    # through row pointers (one launch, two code paths; ptxas gives both ~128 registers).
    pid = tl.program_id(0)
    hkv = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(cu_ptr + b).to(tl.int64)
    q_len = tl.load(cu_ptr + b + 1) - q_start.to(tl.int32)
    t0 = pid * TOK
    if t0 >= q_len:
        return
    ctx = tl.load(cl_ptr + b)
    k_new = k_ptr + q_start * stride_kt + hkv * stride_kh         # row n = new key n of this sequence
    v_new = v_ptr + q_start * stride_vt + hkv * stride_vh
    kc_head = kc_ptr + hkv * stride_kch
    vc_head = vc_ptr + hkv * stride_vch
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    if TMA:
        if t0 >= WIN_N:
            _window_tile(q_ptr, k_new, v_new, k_desc, v_desc, kc_head, vc_head, bt_row, sink_ptr, o_ptr,
                         q_start, q_len, ctx, t0, hkv, stride_qt, stride_qh, stride_kt, stride_vt,
                         stride_kcb, stride_kct, stride_vcb, stride_vct, stride_ot, stride_oh, qk_scale,
                         window, GROUP, TOK, TOK_N, WIN_N, BS, HEAD_D, True, BRANCH)
        else:
            _window_tile(q_ptr, k_new, v_new, k_desc, v_desc, kc_head, vc_head, bt_row, sink_ptr, o_ptr,
                         q_start, q_len, ctx, t0, hkv, stride_qt, stride_qh, stride_kt, stride_vt,
                         stride_kcb, stride_kct, stride_vcb, stride_vct, stride_ot, stride_oh, qk_scale,
                         window, GROUP, TOK, TOK_N, WIN_N, BS, HEAD_D, False, BRANCH)
    else:
        _window_tile(q_ptr, k_new, v_new, k_desc, v_desc, kc_head, vc_head, bt_row, sink_ptr, o_ptr,
                     q_start, q_len, ctx, t0, hkv, stride_qt, stride_qh, stride_kt, stride_vt,
                     stride_kcb, stride_kct, stride_vcb, stride_vct, stride_ot, stride_oh, qk_scale,
                     window, GROUP, TOK, TOK_N, WIN_N, BS, HEAD_D, False, BRANCH)


def default_window_config(head_dim: int, group: int) -> dict:
    """Rows per tile and launch parameters of the window kernel (measured on H200, bench/NOTES.md).
    64 rows / 4 warps: ~126 registers, 44 KB shared memory, 4 programs per SM. ``TMA`` (one launch,
    block A of interior tiles by TMA) from ``TMA_MIN_TOKENS`` new tokens on: run 6 measured 102 /
    373 / 1491 µs at 8k / 32k / 128k against 129 / 495 without TMA (GPU time 98 vs 126 µs at 8k, 52 vs
    66 at 4k; host enqueue 68-103 µs per call, so a call is GPU-bound from ~8k). ``GATHER_BRANCH``
    (115 / 430 µs without TMA) stays opt-in; a variant keeping the window's K/V in registers across
    tiles (run 6: 169-172 / 627 µs) was removed (bench/NOTES.md)."""
    return dict(ROWS=64, num_warps=4, num_stages=1, TMA=True, TMA_MIN_TOKENS=4096, TMA_MAXNREG=128,
                GATHER_BRANCH=False)


def window_supported(window: int, group: int) -> bool:
    """The loop-free kernel needs block A in registers and a power-of-two GQA group."""
    return 0 < window <= MAX_WINDOW and group & (group - 1) == 0


def window_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                     scale: float, window: int, max_seqlen_q: int, out: torch.Tensor,
                     config: dict | None = None):
    """Launch the loop-free window kernel; ``max_seqlen_q`` sizes the grid (no device sync here).
    Returns triton's compiled kernel (the benchmark reads its registers), None if nothing ran."""
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
    rows, tma, tma_min, tma_reg = cfg.pop("ROWS"), cfg.pop("TMA"), cfg.pop("TMA_MIN_TOKENS"), cfg.pop("TMA_MAXNREG")
    branch = bool(cfg.pop("GATHER_BRANCH"))
    if T == 0 or max_seqlen_q == 0:
        return None
    tok = max(1, rows // group)
    if tok * group < 16:
        tok = 16 // group
    win_n = max(16, triton.next_power_of_2(window))
    k_desc, v_desc = k, v
    tma = bool(tma and max_seqlen_q >= max(tma_min, win_n + tok) and _tma_ok(k) and _tma_ok(v))
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k_desc = TensorDescriptor(k, [T, Hkv * D], [k.stride(0), 1], [win_n, D])
        v_desc = TensorDescriptor(v, [T, Hkv * D], [v.stride(0), 1], [win_n, D])
        if tma_reg and "maxnreg" not in cfg:  # both code paths in one kernel: ~150 registers uncapped
            cfg["maxnreg"] = tma_reg
    return _window_kernel[(triton.cdiv(max_seqlen_q, tok), Hkv, B)](
        q, k, v, k_desc, v_desc, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), scale * LOG2E, window,
        GROUP=group, TOK=tok, TOK_N=max(16, triton.next_power_of_2(tok)), WIN_N=win_n,
        BS=k_cache.shape[1], HEAD_D=D, TMA=tma, BRANCH=branch, **cfg)
