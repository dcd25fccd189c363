"""Triton split-KV decode attention, version 2 (the default for full-attention layers with more than
one split; ``MERGE="kernel"`` in triton_attention_decode's config): a split kernel and a merge kernel.

Grid ``(num_splits, Hkv, B)`` as in triton_attention_decode.py: one program reads one slice of one
sequence's cached keys of one KV head for all ``GROUP`` query heads of that KV head (the group is the
M side of the tensor-core product, padded to 16), so each cached K/V byte is read once. Differences
from version 1 (``_decode_split_kernel`` + ``_combine_kernel``):
  * split 0 also takes the new token's own key/value and the sink into its partial, so the sink is
    counted exactly once and ``_merge_kernel`` is a plain merge of partials: its loads depend on no
    other load (the partials are read together with cu; no q/k/v);
  * the context length is read before the ``q_len == 0`` branch (cu and cl in one latency);
  * ``STRIDED`` (full attention; default): program s takes the tiles s, s + S, s + 2S, ...: its first
    pages are read together with cu / cl (bounded by the table's width, not yet by the length), and
    each tile's pages one tile ahead, so the K/V loads are no longer indirect within the loop and
    Triton's pipeline double-buffers them (BLOCK_N 64, 3 stages: 37 KB, 72 registers, 6 programs
    per SM on sm_90). Run 9 on H200: B=1 at 1k / 8k / 32k / 128k 5.7 / 11.2 / 24.1 / 71.8 us vs
    version 1's 6.2 / 11.7 / 25.2 / 73.2 (bench/NOTES.md);
  * ``HEAD_MAJOR`` (default preset since session 6): grid ``(Hkv, S, B)``, so the KV-head programs of one
    split, which read the 128-byte pieces of the same 1 KB token rows, launch side by side (1.2-1.8 %
    faster at B = 1 and 8 on H200; bench/NOTES.md "Decode (session 6)").
With one split (``SINGLE``; opt-in for full attention at B >= 64, ``DAYZERO_DECODE_ONESPLIT``) the split
kernel normalises and writes the output itself (no partials, no merge). ``PDL``: both kernels launched
with programmatic dependent launch (triton_attention_decode's docstring).
Partials are fp32 ``(m, l, acc)`` laid out ``[B, Hkv, S, GROUP(, D)]`` (``PART_BF16``: acc / l in
bf16). Split boundaries come from ``cached_lens`` on the device: no host sync, fixed shapes per
batch size (CUDA-graph safe). A folded variant (the last program per (sequence, KV head) merging
after an atomic ticket, one launch) measured slower at every split count in run 8; its source is in
commit fe79b64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .triton_moe_gemm import interpreting


@triton.jit
def split_bounds(ctx, window, s, num_splits, HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lo, start, stop): the first key a new token at position ``ctx`` sees (window) and the keys
    [start, stop) of split ``s``: the tiles from ``lo`` rounded down, cut into ``num_splits`` equal runs."""
    if HAS_WINDOW:
        lo = tl.maximum(ctx + 1 - window, 0)
    else:
        lo = 0
    lo_al = lo // BLOCK_N * BLOCK_N
    tiles = tl.cdiv(ctx - lo_al, BLOCK_N)
    per = tl.cdiv(tiles, num_splits) * BLOCK_N
    start = lo_al + s * per
    stop = tl.minimum(start + per, ctx)
    return lo, start, stop


@triton.jit
def attend_tile(q, kc_head, vc_head, blk, slot, ok, offs_d, stride_kcb, stride_kct, stride_vcb, stride_vct,
                qk_scale, m_i, l_i, acc):
    """One tile of cached keys (page ``blk``, slot ``slot`` per key; ``ok`` masks) folded into the online
    softmax of the GQA group's queries ``q [G, D]`` (scores in log2 units): (m_i, l_i, acc)."""
    kt = tl.load(kc_head + (blk * stride_kcb + slot * stride_kct)[:, None] + offs_d[None, :],
                 mask=ok[:, None], other=0.0)               # [BN, D]
    vt = tl.load(vc_head + (blk * stride_vcb + slot * stride_vct)[:, None] + offs_d[None, :],
                 mask=ok[:, None], other=0.0)
    qk = tl.dot(q, tl.trans(kt)) * qk_scale                  # [G, BN]
    qk = tl.where(ok[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
    return m_new, l_i, acc


@triton.jit
def load_tile(kc_head, vc_head, blk, slot, ok, offs_d, stride_kcb, stride_kct, stride_vcb, stride_vct):
    """``attend_tile``'s K and V loads alone ([BN, D] each): ``EARLY_KV`` issues them before the PDL wait."""
    kt = tl.load(kc_head + (blk * stride_kcb + slot * stride_kct)[:, None] + offs_d[None, :],
                 mask=ok[:, None], other=0.0)
    vt = tl.load(vc_head + (blk * stride_vcb + slot * stride_vct)[:, None] + offs_d[None, :],
                 mask=ok[:, None], other=0.0)
    return kt, vt


@triton.jit
def attend_loaded(q, kt, vt, ok, qk_scale, m_i, l_i, acc):
    """``attend_tile``'s arithmetic on tiles already loaded (``load_tile``): (m_i, l_i, acc). Kept apart from
    ``attend_tile`` on purpose: routing it through these two changed the shipped kernel's sm_90 code
    (compile_check digest ffc36392918a -> 157ec9eef87d, session 9), which is what was measured."""
    qk = tl.dot(q, tl.trans(kt)) * qk_scale                  # [G, BN]
    qk = tl.where(ok[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
    return m_new, l_i, acc


@triton.jit
def attend_new_and_sink(q, k_row, v_row, offs_d, sink_ptr, heads, g_ok, qk_scale, m_i, l_i, acc):
    """The new token's own key / value (``k_row`` / ``v_row``: its [D] vectors) and the heads' sinks
    (denominator only) folded into the online softmax of ``q [G, D]``: (m_i, l_i, acc)."""
    kn = tl.load(k_row + offs_d).to(tl.float32)                                       # [D]
    vn = tl.load(v_row + offs_d).to(tl.float32)
    sn = tl.sum(q.to(tl.float32) * kn[None, :], 1) * qk_scale                         # [G]
    sink = tl.load(sink_ptr + heads, mask=g_ok, other=0.0).to(tl.float32) * 1.4426950408889634
    m_new = tl.maximum(tl.maximum(m_i, sn), sink)
    alpha = tl.math.exp2(m_i - m_new)
    pn = tl.math.exp2(sn - m_new)
    l_i = l_i * alpha + pn + tl.math.exp2(sink - m_new)
    acc = acc * alpha[:, None] + pn[:, None] * vn[None, :]
    return m_new, l_i, acc


@triton.jit
def fold_new_and_sink(sn, vn, sink, m_i, l_i, acc):
    """``attend_new_and_sink`` after its loads (``EARLY_NEW``: the new key's scores ``sn [G]`` and the sinks
    ``sink [G]`` in log2 units, its value ``vn [D]``). The same operations; kept apart so the shipped kernels'
    sm_90 code stays what was measured (calling this from attend_new_and_sink changed their scheduling)."""
    m_new = tl.maximum(tl.maximum(m_i, sn), sink)
    alpha = tl.math.exp2(m_i - m_new)
    pn = tl.math.exp2(sn - m_new)
    l_i = l_i * alpha + pn + tl.math.exp2(sink - m_new)
    acc = acc * alpha[:, None] + pn[:, None] * vn[None, :]
    return m_new, l_i, acc


@triton.jit
def group_query(q_ptr, q_row, hkv, stride_qt, stride_qh, GROUP: tl.constexpr, G_P2: tl.constexpr,
                HEAD_D: tl.constexpr):
    """The GROUP query heads of KV head ``hkv`` at token row ``q_row``: (q [G, D], heads [G], g_ok [G],
    offs_g, offs_d, q_row as int64)."""
    offs_g = tl.arange(0, G_P2)
    offs_d = tl.arange(0, HEAD_D)
    g_ok = offs_g < GROUP
    heads = hkv * GROUP + offs_g                                 # [G] query heads of this KV head
    q_row64 = q_row.to(tl.int64)
    q = tl.load(q_ptr + q_row64 * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_ok[:, None], other=0.0)                  # [G, D]
    return q, heads, g_ok, offs_g, offs_d, q_row64


@triton.jit
def _decode_split2_kernel(q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, cl_ptr, sink_ptr,
                          o_ptr, mp_ptr, lp_ptr, op_ptr,
                          stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                          stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                          stride_bt, stride_ot, stride_oh, qk_scale, window, num_splits, bt_cols,
                          GROUP: tl.constexpr, G_P2: tl.constexpr, BS: tl.constexpr, HEAD_D: tl.constexpr,
                          BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, PART_BF16: tl.constexpr,
                          STRIDED: tl.constexpr, SINGLE: tl.constexpr, PDL: tl.constexpr,
                          HEAD_MAJOR: tl.constexpr = False, EARLY_NEW: tl.constexpr = False,
                          EARLY_KV: tl.constexpr = 0):
    if PDL and EARLY_KV == 0:  # nothing is read before the previous grid is done and visible; then the merge may launch
        gdc_wait()
        gdc_launch_dependents()
    if HEAD_MAJOR:  # grid (Hkv, S, B): the KV heads of one split launch side by side
        hkv = tl.program_id(0)
        s = tl.program_id(1)
        n_kv = tl.num_programs(0)
    else:           # grid (S, Hkv, B)
        s = tl.program_id(0)
        hkv = tl.program_id(1)
        n_kv = tl.num_programs(1)
    b = tl.program_id(2)
    offs_n = tl.arange(0, BLOCK_N)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    q_row = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_row
    ctx = tl.load(cl_ptr + b)   # before the branch: the three loads overlap (one latency, not two)
    if STRIDED:  # the first tile's pages, read before ctx is known (only the table's width bounds it)
        col0 = (s * BLOCK_N + offs_n) // BS
        blk_nx = tl.load(bt_row + col0, mask=col0 < bt_cols, other=0)
    if q_len == 0:  # no new token: no partials (the merge skips this sequence too)
        return
    if EARLY_KV > 0:  # (STRIDED) the first EARLY_KV tiles' K / V, then the wait: see splitkv_decode
        step = num_splits * BLOCK_N
        offs_dk = tl.arange(0, HEAD_D)
        pos_a = s * BLOCK_N + offs_n
        ok_a = pos_a < ctx
        kc_e = kc_ptr + hkv * stride_kch
        vc_e = vc_ptr + hkv * stride_vch
        ka, va = load_tile(kc_e, vc_e, blk_nx.to(tl.int64), (pos_a % BS).to(tl.int64), ok_a, offs_dk,
                           stride_kcb, stride_kct, stride_vcb, stride_vct)
        blk_nx = tl.load(bt_row + (pos_a + step) // BS, mask=pos_a + step < ctx, other=0)
        if EARLY_KV > 1:
            pos_b = pos_a + step
            ok_b = pos_b < ctx
            kb, vb = load_tile(kc_e, vc_e, blk_nx.to(tl.int64), (pos_b % BS).to(tl.int64), ok_b, offs_dk,
                               stride_kcb, stride_kct, stride_vcb, stride_vct)
            blk_nx = tl.load(bt_row + (pos_b + step) // BS, mask=pos_b + step < ctx, other=0)
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
    lo, start, stop = split_bounds(ctx, window, s, num_splits, HAS_WINDOW, BLOCK_N)
    q, heads, g_ok, offs_g, offs_d, q_row64 = group_query(q_ptr, q_row, hkv, stride_qt, stride_qh,
                                                          GROUP, G_P2, HEAD_D)
    m_i = tl.zeros([G_P2], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([G_P2], dtype=tl.float32)
    acc = tl.zeros([G_P2, HEAD_D], dtype=tl.float32)
    if EARLY_NEW:  # the new key / value and the sinks read before the loop (split 0 folds them in after it)
        kn = tl.load(k_ptr + q_row64 * stride_kt + hkv * stride_kh + offs_d).to(tl.float32)       # [D]
        vn = tl.load(v_ptr + q_row64 * stride_vt + hkv * stride_vh + offs_d).to(tl.float32)
        sink = tl.load(sink_ptr + heads, mask=g_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        sn = tl.sum(q.to(tl.float32) * kn[None, :], 1) * qk_scale                             # [G]

    kc_head = kc_ptr + hkv * stride_kch
    vc_head = vc_ptr + hkv * stride_vch
    if STRIDED:  # program s takes tiles s, s + S, s + 2S, ... (full attention only: lo == 0)
        first = s * BLOCK_N
        step = num_splits * BLOCK_N
        if EARLY_KV > 0:
            m_i, l_i, acc = attend_loaded(q, ka, va, ok_a, qk_scale, m_i, l_i, acc)
            first += step
        if EARLY_KV > 1:
            m_i, l_i, acc = attend_loaded(q, kb, vb, ok_b, qk_scale, m_i, l_i, acc)
            first += step
        last = ctx
    else:        # program s takes one contiguous run of tiles
        first = start
        step = BLOCK_N
        last = stop
    for n0 in range(first, last, step):
        pos = n0 + offs_n
        ok = (pos >= lo) & (pos < ctx)
        if STRIDED:
            blk = blk_nx.to(tl.int64)
            nxt = pos + step
            blk_nx = tl.load(bt_row + nxt // BS, mask=nxt < ctx, other=0)  # the next tile's pages
        else:
            blk = tl.load(bt_row + pos // BS, mask=ok, other=0).to(tl.int64)
        m_i, l_i, acc = attend_tile(q, kc_head, vc_head, blk, (pos % BS).to(tl.int64), ok, offs_d, stride_kcb,
                                    stride_kct, stride_vcb, stride_vct, qk_scale, m_i, l_i, acc)

    if s == 0:  # the new token's own key/value (position ctx) and the sink: split 0 only
        if EARLY_NEW:
            m_i, l_i, acc = fold_new_and_sink(sn, vn, sink, m_i, l_i, acc)
        else:
            m_i, l_i, acc = attend_new_and_sink(q, k_ptr + q_row64 * stride_kt + hkv * stride_kh,
                                                v_ptr + q_row64 * stride_vt + hkv * stride_vh, offs_d,
                                                sink_ptr, heads, g_ok, qk_scale, m_i, l_i, acc)

    if SINGLE:  # one split (num_splits == 1): normalise and write the output, no partials
        tl.store(o_ptr + q_row64 * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=g_ok[:, None])
        return
    seq_head = (b * n_kv + hkv).to(tl.int64)
    row = (seq_head * num_splits + s) * GROUP + offs_g                        # [G] partial rows
    tl.store(mp_ptr + row, m_i, mask=g_ok)
    tl.store(lp_ptr + row, l_i, mask=g_ok)
    if PART_BF16:  # normalised partial output in bf16 (half the bytes the merge reads back)
        part = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    else:
        part = acc
    tl.store(op_ptr + row[:, None] * HEAD_D + offs_d[None, :], part.to(op_ptr.dtype.element_ty), mask=g_ok[:, None])


@triton.jit
def _merge_kernel(cu_ptr, o_ptr, mp_ptr, lp_ptr, op_ptr, stride_ot, stride_oh, num_splits,
                  GROUP: tl.constexpr, HEAD_D: tl.constexpr, S_P2: tl.constexpr, PART_BF16: tl.constexpr,
                  PDL: tl.constexpr, EARLY_TRIGGER: tl.constexpr = False):
    """Grid (Hq, B): merge one head's split partials (split 0 holds the new key and the sink).
    ``PDL``: launched while the split kernel runs; cu (which the split kernel does not write, and which
    its programs read only after their own wait) is read first, the partials only after the wait.
    ``EARLY_TRIGGER``: the next PDL grid may launch before this one's wait (a split kernel behind it with
    ``EARLY_KV`` then loads its first tiles while this merge waits; it writes partials only after its own wait,
    i.e. after this merge has read them)."""
    h = tl.program_id(0)
    b = tl.program_id(1)
    offs_s = tl.arange(0, S_P2)
    offs_d = tl.arange(0, HEAD_D)
    s_ok = offs_s < num_splits
    n_kv = tl.num_programs(0) // GROUP
    row = ((b * n_kv + h // GROUP).to(tl.int64) * num_splits + offs_s) * GROUP + h % GROUP     # [S]
    if PDL:
        if EARLY_TRIGGER:
            gdc_launch_dependents()
        q_row = tl.load(cu_ptr + b)
        q_end = tl.load(cu_ptr + b + 1)
        gdc_wait()
        if not EARLY_TRIGGER:
            gdc_launch_dependents()
    # the partials' addresses depend on no load: without PDL they are read together with cu
    m_s = tl.load(mp_ptr + row, mask=s_ok, other=-1.0e30)
    l_s = tl.load(lp_ptr + row, mask=s_ok, other=0.0)
    o_s = tl.load(op_ptr + row[:, None] * HEAD_D + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    if not PDL:
        q_row = tl.load(cu_ptr + b)
        q_end = tl.load(cu_ptr + b + 1)
    if q_end == q_row:
        return
    w = tl.math.exp2(m_s - tl.max(m_s, 0))                                          # [S]
    wl = l_s * w
    if PART_BF16:
        w = wl
    acc = tl.sum(o_s.to(tl.float32) * w[:, None], 0)                                 # [D]
    tl.store(o_ptr + q_row.to(tl.int64) * stride_ot + h * stride_oh + offs_d,
             (acc / tl.sum(wl, 0)).to(o_ptr.dtype.element_ty))


def splitkv_decode(cfg: dict, num_splits: int, q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q,
                   cached_lens, sinks, qk_scale: float, window: int, out: torch.Tensor, pdl: bool = False,
                   merge: bool = True) -> torch.Tensor:
    """Split kernel, then ``_merge_kernel`` (``cfg``: BLOCK_N, STRIDED (full attention only), PART_BF16,
    HEAD_MAJOR (grid (Hkv, S, B) instead of (S, Hkv, B)), EARLY_NEW (the new key / value and the sinks read
    before the loop, not after it in split 0), EARLY_KV (0-2; strided, split: each program's first EARLY_KV
    tiles of cached K / V loaded before its PDL wait, so they stream while the previous kernel finishes; this
    reads cu / cached_lens / the table and cache rows below each sequence's length before the wait, which is
    safe because no kernel of a decode step writes those: the metadata is copied before the step and the new
    key is stored at position ctx, which the split kernel takes from ``k`` / ``v``, after the wait), num_warps,
    num_stages, maxnreg), EARLY_TRIGGER (the merge lets the next PDL grid launch before its own wait: see
    ``_merge_kernel``). ``num_splits == 1``: the split kernel alone writes ``out``.
    ``pdl``: both kernels launched with programmatic dependent launch (ignored by the interpreter).
    ``merge=False`` (benchmarks only: the split kernel's time alone) leaves the partials unmerged."""
    cfg = dict(cfg)
    bn = cfg.pop("BLOCK_N")
    part_bf16 = bool(cfg.pop("PART_BF16", False))
    strided = bool(cfg.pop("STRIDED", False)) and window == 0
    head_major = bool(cfg.pop("HEAD_MAJOR", False))
    early_new = bool(cfg.pop("EARLY_NEW", False))
    early_kv = int(cfg.pop("EARLY_KV", 0))
    early_trigger = bool(cfg.pop("EARLY_TRIGGER", False))
    if not 0 <= early_kv <= 2:
        raise ValueError(f"EARLY_KV must be 0, 1 or 2 tiles, got {early_kv}")
    early_kv = early_kv if strided and num_splits > 1 else 0
    pdl = bool(pdl) and not interpreting()
    extra = dict(launch_pdl=True) if pdl else {}
    B, Hkv, D = cached_lens.shape[0], k.shape[1], q.shape[2]
    group = q.shape[1] // Hkv
    single = num_splits == 1
    mp, lp, op = split_partials(out, B, Hkv, num_splits, group, D, part_bf16)
    grid = (Hkv, num_splits, B) if head_major else (num_splits, Hkv, B)
    _decode_split2_kernel[grid](
        q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, out, mp, lp, op,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), qk_scale, window, num_splits, block_tables.shape[1],
        GROUP=group, G_P2=max(16, triton.next_power_of_2(group)), BS=k_cache.shape[1], HEAD_D=D, BLOCK_N=bn,
        HAS_WINDOW=window > 0, PART_BF16=part_bf16, STRIDED=strided, SINGLE=single, PDL=pdl,
        HEAD_MAJOR=head_major, EARLY_NEW=early_new, EARLY_KV=early_kv, **cfg, **extra)
    if single or not merge:
        return out
    return merge_splits(cu_seqlens_q, out, mp, lp, op, num_splits, group, part_bf16, pdl, early_trigger)


def split_partials(out, B: int, Hkv: int, num_splits: int, group: int, D: int, part_bf16: bool = False):
    """The split kernels' partials: row max / row sum ``[B, Hkv, S, group]`` fp32 and output
    ``[B, Hkv, S, group, D]`` (fp32 or bf16); one split writes ``out`` itself (the three are then unused)."""
    if num_splits == 1:
        return out, out, out
    mp = torch.empty((B, Hkv, num_splits, group), device=out.device, dtype=torch.float32)
    op = torch.empty((B, Hkv, num_splits, group, D), device=out.device,
                     dtype=torch.bfloat16 if part_bf16 else torch.float32)
    return mp, torch.empty_like(mp), op


def merge_splits(cu_seqlens_q, out, mp, lp, op, num_splits: int, group: int, part_bf16: bool, pdl: bool,
                 early_trigger: bool = False):
    """``_merge_kernel`` over the partials of ``split_partials`` into ``out`` [T, Hq, D] (one program per query
    head and sequence; the sink was counted by split 0 only)."""
    B, D = mp.shape[0], out.shape[2]
    _merge_kernel[(out.shape[1], B)](cu_seqlens_q, out, mp, lp, op, out.stride(0), out.stride(1), num_splits,
                                     GROUP=group, HEAD_D=D, S_P2=max(2, triton.next_power_of_2(num_splits)),
                                     PART_BF16=part_bf16, PDL=pdl, EARLY_TRIGGER=early_trigger and pdl, num_warps=1,
                                     **(dict(launch_pdl=True) if pdl else {}))
    return out
