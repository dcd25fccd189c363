"""Triton split-KV decode attention, version 3 (session 6): warp slices (``MERGE="kernel", WSLICE=True``).

Same grid, partials and merge as triton_attention_splitkv.py (``(num_splits, Hkv, B)``; one program
reads one slice of one sequence's cached keys of one KV head for the GQA group; ``STRIDED`` tiles:
program s takes tiles s, s + S, ...; split 0 adds the new key and the sink; ``_merge_kernel``
merges), but each tile of ``W * SUB`` keys is cut into ``W = num_warps`` slices of ``SUB`` keys and
the product is a batched dot over the slices (``[W, G, D] x [W, D, SUB]``): Triton puts one slice per
warp, so every warp runs its own online softmax over its keys and the row max / row sum of a tile are
reduced inside a warp (shuffles), not across warps through shared memory. The version-2 loop (4 warps
splitting the keys of one ``[16, 64]`` score tile) has 9 CTA barriers per tile on sm_90 and ~410
instructions a warp; the warps' states are merged once, after the loop. The pages of the next tile
are read one tile ahead (one page index per key; with ``SUB == BS`` a slice is one page). Reading them
two tiles ahead (two carried page tensors) made Triton's pipeliner drop the cp.async double buffer
(sm_90 build: no LDGSTS), so one tile ahead it stays.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .triton_attention_splitkv import attend_new_and_sink, group_query


@triton.jit
def _decode_wslice_kernel(q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, cl_ptr, sink_ptr,
                          o_ptr, mp_ptr, lp_ptr, op_ptr,
                          stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                          stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                          stride_bt, stride_ot, stride_oh, qk_scale, num_splits, bt_cols,
                          GROUP: tl.constexpr, G_P2: tl.constexpr, BS: tl.constexpr, HEAD_D: tl.constexpr,
                          W: tl.constexpr, SUB: tl.constexpr, SINGLE: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # nothing is read before the previous grid is done and visible; then the merge may launch
        gdc_wait()
        gdc_launch_dependents()
    s = tl.program_id(0)
    hkv = tl.program_id(1)
    b = tl.program_id(2)
    n_kv = tl.num_programs(1)
    TILE: tl.constexpr = W * SUB
    offs_w = tl.arange(0, W)
    offs_j = tl.arange(0, SUB)
    key = offs_w[:, None] * SUB + offs_j[None, :]                  # [W, SUB] key of the tile
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    q_row = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_row
    ctx = tl.load(cl_ptr + b)   # cu, cl and the first pages in one latency
    col0 = (s * TILE + key) // BS
    blk_nx = tl.load(bt_row + col0, mask=col0 < bt_cols, other=0)  # [W, SUB] pages of the first tile
    if q_len == 0:  # no new token: no partials (the merge skips this sequence too)
        return
    q, heads, g_ok, offs_g, offs_d, q_row64 = group_query(q_ptr, q_row, hkv, stride_qt, stride_qh,
                                                          GROUP, G_P2, HEAD_D)
    q3 = tl.broadcast_to(q[None, :, :], (W, G_P2, HEAD_D))          # [W, G, D]
    m_i = tl.zeros([W, G_P2], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([W, G_P2], dtype=tl.float32)
    acc = tl.zeros([W, G_P2, HEAD_D], dtype=tl.float32)
    kc_head = kc_ptr + hkv * stride_kch
    vc_head = vc_ptr + hkv * stride_vch
    step = num_splits * TILE
    for n0 in range(s * TILE, ctx, step):
        pos = n0 + key                                              # [W, SUB]
        ok = pos < ctx
        blk = blk_nx.to(tl.int64)
        nxt = pos + step
        blk_nx = tl.load(bt_row + nxt // BS, mask=nxt < ctx, other=0)   # the next tile's pages
        slot = (pos % BS).to(tl.int64)
        k_off = (blk * stride_kcb + slot * stride_kct)[:, :, None] + offs_d[None, None, :]
        v_off = (blk * stride_vcb + slot * stride_vct)[:, :, None] + offs_d[None, None, :]
        kt = tl.load(kc_head + k_off, mask=ok[:, :, None], other=0.0)    # [W, SUB, D]
        vt = tl.load(vc_head + v_off, mask=ok[:, :, None], other=0.0)
        qk = tl.dot(q3, tl.trans(kt, (0, 2, 1))) * qk_scale              # [W, G, SUB]
        qk = tl.where(ok[:, None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 2))
        p = tl.math.exp2(qk - m_new[:, :, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 2)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(vt.dtype), vt)     # [W, G, D]
        m_i = m_new

    # the warps' slices merged once: [W, G] -> [G]
    m_g = tl.max(m_i, 0)
    wgt = tl.math.exp2(m_i - m_g[None, :])
    l_g = tl.sum(l_i * wgt, 0)
    acc_g = tl.sum(acc * wgt[:, :, None], 0)                            # [G, D]
    if s == 0:  # the new token's own key/value (position ctx) and the sink: split 0 only
        m_g, l_g, acc_g = attend_new_and_sink(q, k_ptr + q_row64 * stride_kt + hkv * stride_kh,
                                              v_ptr + q_row64 * stride_vt + hkv * stride_vh, offs_d,
                                              sink_ptr, heads, g_ok, qk_scale, m_g, l_g, acc_g)
    if SINGLE:  # one split: normalise and write the output, no partials
        tl.store(o_ptr + q_row64 * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 (acc_g / l_g[:, None]).to(o_ptr.dtype.element_ty), mask=g_ok[:, None])
        return
    seq_head = (b * n_kv + hkv).to(tl.int64)
    row = (seq_head * num_splits + s) * GROUP + offs_g                        # [G] partial rows
    tl.store(mp_ptr + row, m_g, mask=g_ok)
    tl.store(lp_ptr + row, l_g, mask=g_ok)
    tl.store(op_ptr + row[:, None] * HEAD_D + offs_d[None, :], acc_g, mask=g_ok[:, None])


def launch_wslice(cfg: dict, num_splits: int, q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q,
                  cached_lens, sinks, out, mp, lp, op, qk_scale: float, pdl: bool):
    """The version-3 split kernel (``cfg``: SUB keys per warp slice (default 16, at least 16), num_warps =
    slices per tile, num_stages, maxnreg); any page size (a page index per key); partials as triton_attention_splitkv's (fp32)."""
    cfg = dict(cfg)
    sub = cfg.pop("SUB", 16)
    warps = cfg.get("num_warps", 4)
    extra = dict(launch_pdl=True) if pdl else {}
    B, Hkv, D = cached_lens.shape[0], k.shape[1], q.shape[2]
    group = q.shape[1] // Hkv
    _decode_wslice_kernel[(num_splits, Hkv, B)](
        q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, out, mp, lp, op,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), qk_scale, num_splits, block_tables.shape[1],
        GROUP=group, G_P2=max(16, triton.next_power_of_2(group)), BS=k_cache.shape[1], HEAD_D=D,
        W=warps, SUB=sub, SINGLE=num_splits == 1, PDL=pdl, **cfg, **extra)
