"""Split-KV decode attention whose K/V pages arrive by TMA (candidate, opt-in; session 6, CPU only).

The shipped split kernel (triton_attention_splitkv.py) gathers each 64-key tile with per-thread cp.async
(LDGSTS): every thread computes 8 addresses a tile from the page table and issues 16-byte copies. Here the
paged cache is seen as one 2-D tensor ``[NB * BS, Hkv * D]`` (rows = token slots, 1 KB each for the 20B /
120B shapes) and one page of one KV head, ``[BS, D]`` at row ``page * BS``, column ``hkv * D``, is ONE
tensor-descriptor load: on sm_90 a single thread issues a ``cp.async.bulk.tensor`` (UTMALDG) per page into a
shared-memory ring guarded by mbarriers (Triton's pipeliner builds the ring from ``num_stages``): no per-thread
address math or copies for K/V, deeper rings cost shared memory only, and the bytes in flight per program are
``(num_stages - 1) * PAGES * 2 * BS * D * 2``. (The loop is not shorter than the shipped one: bench/NOTES.md.)

Grid ``(Hkv, S, B)`` (head-major, as the shipped default): program ``(hkv, s, b)`` takes the tiles of
``PAGES`` pages ``s, s + S, s + 2S, ...`` of sequence ``b`` (strided, full attention only) for the GQA group
of ``hkv``. A tile's pages are scored one by one (``[G, BS]`` each, straight from the shared-memory page)
and folded into the online softmax with ONE row max per tile and no row sum in the loop (per-column sums,
reduced once after it). Whole tiles run unmasked in the pipelined loop; the partial last tile (one split's)
runs after it with the slots past the cached length masked in the scores and their value rows zeroed (a TMA
load copies whole pages; those slots may hold anything, NaN included). Split 0 adds the new token's key /
value and the sinks (once). Partials are the shipped layout ``[B, Hkv, S, GROUP(, D)]`` and the shipped
``_merge_kernel`` merges them in split order (deterministic). One split (``SINGLE``) writes the output
itself. ``PDL``: as the shipped split kernel. Opt-in presets ``tma_*`` in triton_attention_decode.py.
Shapes are fixed per batch size and the split bounds come from ``cached_lens`` on the device: CUDA-graph
safe (the host descriptors hold only the cache's address, shape and strides).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from .triton_attention_splitkv import attend_new_and_sink, group_query, merge_splits, split_partials
from .triton_moe_gemm import interpreting


@triton.jit
def _blk(bt_row, p0, ctx, BS: tl.constexpr):
    """Cache page of the keys from ``p0`` (page 0, never read into the result, past ``ctx``)."""
    return tl.load(bt_row + p0 // BS, mask=p0 < ctx, other=0)


@triton.jit
def _page(q, kc_desc, vc_desc, blk, p0, ctx, col, qk_scale, BS: tl.constexpr, MASK: tl.constexpr):
    """Page ``blk`` holding keys ``[p0, p0 + BS)``: scores ``[G, BS]`` (log2 units) and the value rows
    ``[BS, D]``; ``MASK``: scores -inf and value rows zero past ``ctx`` (only the last tile needs it)."""
    row = blk * BS
    kt = kc_desc.load([row, col])                                          # [BS, D]
    vt = vc_desc.load([row, col])
    qk = tl.dot(q, tl.trans(kt)) * qk_scale                                # [G, BS]
    if MASK:
        ok = (p0 + tl.arange(0, BS)) < ctx
        qk = tl.where(ok[None, :], qk, float("-inf"))
        vt = tl.where(ok[:, None], vt, tl.zeros_like(vt))
    return qk, vt


@triton.jit
def _tile(q, kc_desc, vc_desc, b0, b1, b2, b3, n0, ctx, col, qk_scale, m_i, l_acc, acc,
          BS: tl.constexpr, PAGES: tl.constexpr, MASK: tl.constexpr):
    """The ``PAGES`` pages ``b0..`` of keys ``[n0, n0 + PAGES * BS)`` folded into the online softmax: ONE row max
    per tile (the pages' scores share a layout: their elementwise max first), no row sum (``l_acc [G, BS]``
    keeps per-column sums, reduced once after the loop): (m_i, l_acc, acc)."""
    s0, v0 = _page(q, kc_desc, vc_desc, b0, n0, ctx, col, qk_scale, BS, MASK)
    mx = s0
    if PAGES >= 2:
        s1, v1 = _page(q, kc_desc, vc_desc, b1, n0 + BS, ctx, col, qk_scale, BS, MASK)
        mx = tl.maximum(mx, s1)
    if PAGES >= 4:
        s2, v2 = _page(q, kc_desc, vc_desc, b2, n0 + 2 * BS, ctx, col, qk_scale, BS, MASK)
        s3, v3 = _page(q, kc_desc, vc_desc, b3, n0 + 3 * BS, ctx, col, qk_scale, BS, MASK)
        mx = tl.maximum(mx, tl.maximum(s2, s3))
    m_new = tl.maximum(m_i, tl.max(mx, 1))
    alpha = tl.math.exp2(m_i - m_new)
    acc = acc * alpha[:, None]
    p = tl.math.exp2(s0 - m_new[:, None])
    ps = p
    acc = tl.dot(p.to(v0.dtype), v0, acc)
    if PAGES >= 2:
        p = tl.math.exp2(s1 - m_new[:, None])
        ps += p
        acc = tl.dot(p.to(v1.dtype), v1, acc)
    if PAGES >= 4:
        p = tl.math.exp2(s2 - m_new[:, None])
        ps += p
        acc = tl.dot(p.to(v2.dtype), v2, acc)
        p = tl.math.exp2(s3 - m_new[:, None])
        ps += p
        acc = tl.dot(p.to(v3.dtype), v3, acc)
    return m_new, l_acc * alpha[:, None] + ps, acc


@triton.jit
def _decode_tma_kernel(q_ptr, k_ptr, v_ptr, kc_desc, vc_desc, bt_ptr, cu_ptr, cl_ptr, sink_ptr,
                       o_ptr, mp_ptr, lp_ptr, op_ptr,
                       stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                       stride_bt, stride_ot, stride_oh, qk_scale, num_splits,
                       GROUP: tl.constexpr, G_P2: tl.constexpr, BS: tl.constexpr, HEAD_D: tl.constexpr,
                       PAGES: tl.constexpr, SINGLE: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # nothing is read before the previous grid is done and visible; then the merge may launch
        gdc_wait()
        gdc_launch_dependents()
    hkv = tl.program_id(0)
    s = tl.program_id(1)
    b = tl.program_id(2)
    n_kv = tl.num_programs(0)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    q_row = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_row
    ctx = tl.load(cl_ptr + b)
    if q_len == 0:  # no new token: no partials (the merge skips this sequence too)
        return
    q, heads, g_ok, offs_g, offs_d, q_row64 = group_query(q_ptr, q_row, hkv, stride_qt, stride_qh,
                                                          GROUP, G_P2, HEAD_D)
    m_i = tl.zeros([G_P2], dtype=tl.float32) - 1.0e30
    l_acc = tl.zeros([G_P2, BS], dtype=tl.float32)   # per-column softmax sums (one row sum after the loop)
    acc = tl.zeros([G_P2, HEAD_D], dtype=tl.float32)
    col = hkv * HEAD_D
    TILE: tl.constexpr = PAGES * BS
    # the tile's pages are read one tile ahead (loop-carried), so the TMA loads of a tile depend on no load
    # of the same iteration and the pipeliner keeps num_stages - 1 tiles in flight
    n0 = s * TILE
    b0 = _blk(bt_row, n0, ctx, BS)
    b1 = _blk(bt_row, n0 + BS, ctx, BS)
    b2 = _blk(bt_row, n0 + 2 * BS, ctx, BS)
    b3 = _blk(bt_row, n0 + 3 * BS, ctx, BS)
    step = num_splits * TILE
    full = ctx // TILE * TILE   # whole tiles: no masks in the loop
    for n0 in range(s * TILE, full, step):
        nx = n0 + step
        n_b0 = _blk(bt_row, nx, ctx, BS)
        n_b1 = _blk(bt_row, nx + BS, ctx, BS)
        n_b2 = _blk(bt_row, nx + 2 * BS, ctx, BS)
        n_b3 = _blk(bt_row, nx + 3 * BS, ctx, BS)
        m_i, l_acc, acc = _tile(q, kc_desc, vc_desc, b0, b1, b2, b3, n0, ctx, col, qk_scale, m_i, l_acc, acc,
                                BS, PAGES, False)
        b0, b1, b2, b3 = n_b0, n_b1, n_b2, n_b3
    # the partial last tile (keys [full, ctx)), in the split whose stride it falls in: the loop left that split's
    # page registers at exactly this tile
    if (full < ctx) & ((full // TILE) % num_splits == s):
        m_i, l_acc, acc = _tile(q, kc_desc, vc_desc, b0, b1, b2, b3, full, ctx, col, qk_scale, m_i, l_acc, acc,
                                BS, PAGES, True)
    l_i = tl.sum(l_acc, 1)

    if s == 0:  # the new token's own key/value (position ctx) and the sink: split 0 only
        m_i, l_i, acc = attend_new_and_sink(q, k_ptr + q_row64 * stride_kt + hkv * stride_kh,
                                            v_ptr + q_row64 * stride_vt + hkv * stride_vh, offs_d,
                                            sink_ptr, heads, g_ok, qk_scale, m_i, l_i, acc)
    if SINGLE:  # one split: normalise and write the output, no partials
        tl.store(o_ptr + q_row64 * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=g_ok[:, None])
        return
    row = ((b * n_kv + hkv).to(tl.int64) * num_splits + s) * GROUP + offs_g            # [G] partial rows
    tl.store(mp_ptr + row, m_i, mask=g_ok)
    tl.store(lp_ptr + row, l_i, mask=g_ok)
    tl.store(op_ptr + row[:, None] * HEAD_D + offs_d[None, :], acc, mask=g_ok[:, None])


def tma_supported(k_cache: torch.Tensor, v_cache: torch.Tensor, window: int) -> bool:
    """Full attention on a cache whose dims are dense (the 2-D view the descriptors need), 16-byte aligned, page
    and head sizes a TMA box allows (D * element size 16-128 bytes)."""
    if window > 0:
        return False
    for c in (k_cache, v_cache):
        NB, BS, Hkv, D = c.shape
        if c.stride() != (BS * Hkv * D, Hkv * D, D, 1) or c.data_ptr() % 16:   # rows evenly strided
            return False
        if c.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            return False
        # box rows <= 256; one box row of 16-128 bytes (the 128-byte swizzle's span)
        if BS > 256 or BS & (BS - 1) or D & (D - 1) or not 16 <= D * c.element_size() <= 128:
            return False
    return True


def _descriptor(cache: torch.Tensor) -> TensorDescriptor:
    NB, BS, Hkv, D = cache.shape
    return TensorDescriptor(cache, [NB * BS, Hkv * D], [Hkv * D, 1], [BS, D])


def tma_decode(cfg: dict, num_splits: int, q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens,
               sinks, qk_scale: float, out: torch.Tensor, pdl: bool = False, merge: bool = True) -> torch.Tensor:
    """TMA split kernel, then triton_attention_splitkv's ``_merge_kernel`` (``cfg``: PAGES (1, 2 or 4 pages a
    tile), num_warps, num_stages). Full attention only (see ``tma_supported``); ``num_splits == 1``: the split
    kernel alone writes ``out``. ``merge=False``: benchmarks only (the split kernel's time alone)."""
    cfg = dict(cfg)
    pages = int(cfg.pop("PAGES", 4))
    if pages not in (1, 2, 4):
        raise ValueError(f"TMA decode: PAGES must be 1, 2 or 4, got {pages}")
    unknown = set(cfg) - {"num_warps", "num_stages", "maxnreg"}
    if unknown:
        raise ValueError(f"TMA decode: unknown config keys {sorted(unknown)}")
    pdl = bool(pdl) and not interpreting()
    extra = dict(launch_pdl=True) if pdl else {}
    B, Hkv, D = cached_lens.shape[0], k.shape[1], q.shape[2]
    group = q.shape[1] // Hkv
    single = num_splits == 1
    mp, lp, op = split_partials(out, B, Hkv, num_splits, group, D)
    _decode_tma_kernel[(Hkv, num_splits, B)](
        q, k, v, _descriptor(k_cache), _descriptor(v_cache), block_tables, cu_seqlens_q, cached_lens, sinks,
        out, mp, lp, op, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        block_tables.stride(0), out.stride(0), out.stride(1), qk_scale, num_splits,
        GROUP=group, G_P2=max(16, triton.next_power_of_2(group)), BS=k_cache.shape[1], HEAD_D=D, PAGES=pages,
        SINGLE=single, PDL=pdl, **cfg, **extra)
    if single or not merge:
        return out
    return merge_splits(cu_seqlens_q, out, mp, lp, op, num_splits, group, False, pdl)
