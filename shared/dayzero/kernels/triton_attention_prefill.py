"""Triton prefill attention with sinks: causal, variable length, paged cached prefix, sliding window.

One program computes a tile of ``BLOCK_M`` query rows of one sequence (flash attention, online
softmax in base 2). With ``PACK`` the rows are ``BLOCK_M // GROUP`` tokens x the ``GROUP`` query
heads that share one KV head (GQA packing): the tile spans few positions, so sliding-window and
diagonal tiles waste few scores; without it the rows are ``BLOCK_M`` tokens of one head.
Keys come from two places (see torch_attention's contract):
  * the cached prefix, positions ``[0, cached_len)``, gathered from the paged cache through the
    block table (chunked prefill), and
  * the new keys of the same call, positions ``[cached_len, cached_len + q_len)``, read from the
    contiguous ``k``/``v`` tensors (with ``TMA``: through Hopper tensor descriptors).
Each source is walked in three phases: tiles at the window's lower edge (masked), tiles every query
of the tile sees entirely (no mask at all), and tiles at the causal diagonal / end (masked).
The sink joins the softmax once, in the epilogue (``l += exp(sink - m)`` after rescaling), so the
probabilities fed to the PV product stay relative to the largest key score. Cache positions outside
``[lo, hi)`` are never loaded (sliding layers may point stale block-table entries anywhere).
"""

from __future__ import annotations

import os
import warnings

import torch
import triton
import triton.language as tl
from triton.runtime.errors import PTXASError

LOG2E = 1.4426950408889634


@triton.jit
def _tiles(acc, l_i, m_i, q, q_pos, k_desc, v_desc, desc_row, desc_col,
           src_k, src_v, stride_k, stride_v,          # new keys: row pointers of this head, row = index
           bt_row, stride_kb, stride_vb,              # cached keys: block-table row, block strides
           pos_base, start, stop, lo, hi, window, qk_scale,
           PAGED: tl.constexpr, MASK: tl.constexpr, HAS_WINDOW: tl.constexpr, TMA: tl.constexpr,
           BS: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    for n0 in range(start, stop, BLOCK_N):
        idx = n0 + offs_n                                    # [BN] index within the source
        pos = pos_base + idx                                 # [BN] absolute key position
        if MASK:
            ok = (pos >= lo) & (pos < hi)
        if TMA:
            # rows past this sequence belong to the next one (finite) or are zero-filled past T;
            # masked scores drop them, and V is zeroed there so no Inf/NaN can leak through p = 0
            kt = k_desc.load([desc_row + n0, desc_col])      # [BN, D]
            vt = v_desc.load([desc_row + n0, desc_col])
            if MASK:
                vt = tl.where(ok[:, None], vt, 0.0)
        else:
            if PAGED:
                if MASK:
                    blk = tl.load(bt_row + idx // BS, mask=ok, other=0).to(tl.int64)
                else:
                    blk = tl.load(bt_row + idx // BS).to(tl.int64)
                slot = (idx % BS).to(tl.int64)
                k_off = blk * stride_kb + slot * stride_k    # [BN]
                v_off = blk * stride_vb + slot * stride_v
            else:
                k_off = idx.to(tl.int64) * stride_k
                v_off = idx.to(tl.int64) * stride_v
            k_ptrs = src_k + k_off[:, None] + offs_d[None, :]  # [BN, D]
            v_ptrs = src_v + v_off[:, None] + offs_d[None, :]
            if MASK:
                kt = tl.load(k_ptrs, mask=ok[:, None], other=0.0)
                vt = tl.load(v_ptrs, mask=ok[:, None], other=0.0)
            else:
                kt = tl.load(k_ptrs)
                vt = tl.load(v_ptrs)
        qk = tl.dot(q, tl.trans(kt))                         # [BM, BN] raw scores
        if MASK:
            vis = ok[None, :] & (pos[None, :] <= q_pos[:, None])
            if HAS_WINDOW:
                vis = vis & ((q_pos[:, None] - pos[None, :]) < window)
            qk = tl.where(vis, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_new[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_new[:, None]              # one FMA per score
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(vt.dtype), vt, acc)                # accumulate in place
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, k_desc, v_desc, kc_ptr, vc_ptr, bt_ptr, cu_ptr, cl_ptr,
                    sink_ptr, o_ptr,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                    stride_bt, stride_ot, stride_oh,
                    qk_scale, window,
                    GROUP: tl.constexpr, P: tl.constexpr, BS: tl.constexpr, HEAD_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
                    TMA: tl.constexpr):
    TOK_M: tl.constexpr = BLOCK_M // P                       # tokens per tile (P heads each)
    # longest tiles first: program 0 of dim 0 takes the last query tile
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    hg = tl.program_id(1)                                    # query heads [hg*P, hg*P + P)
    b = tl.program_id(2)
    q_start = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_start
    m_start = pid_m * TOK_M
    if m_start >= q_len:
        return
    ctx = tl.load(cl_ptr + b)
    hkv = (hg * P) // GROUP
    offs_r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    tok = m_start + offs_r // P                              # [BM] new-token index of each row
    head = hg * P + offs_r % P                               # [BM] query head of each row
    row_ok = tok < q_len
    rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)             # [BM, D]
    q_pos = ctx + tok                                        # [BM]
    m_end = tl.minimum(m_start + TOK_M, q_len)               # exclusive, new-key index
    if HAS_WINDOW:
        lo = tl.maximum(ctx + m_start - window + 1, 0)       # first position any row sees
    else:
        lo = 0

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30    # finite: no inf - inf
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)

    # ---- cached prefix: positions [lo, ctx), paged ----
    kc_head = kc_ptr + hkv * stride_kch
    vc_head = vc_ptr + hkv * stride_vch
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    c_lo = lo // BLOCK_N * BLOCK_N
    f_hi = ctx // BLOCK_N * BLOCK_N                           # tiles ending at or before ctx
    if HAS_WINDOW:
        f_lo = tl.cdiv(tl.maximum(c_lo, ctx + m_end - window), BLOCK_N) * BLOCK_N
        f_lo = tl.minimum(f_lo, f_hi)
    else:
        f_lo = tl.minimum(c_lo, f_hi)
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, q_pos, k_desc, v_desc, 0, 0, kc_head, vc_head,
                           stride_kct, stride_vct, bt_row, stride_kcb, stride_vcb, 0, c_lo, f_lo, lo, ctx,
                           window, qk_scale, True, True, HAS_WINDOW, False, BS, HEAD_D, BLOCK_N)
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, q_pos, k_desc, v_desc, 0, 0, kc_head, vc_head,
                           stride_kct, stride_vct, bt_row, stride_kcb, stride_vcb, 0, f_lo, f_hi, lo, ctx,
                           window, qk_scale, True, False, HAS_WINDOW, False, BS, HEAD_D, BLOCK_N)
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, q_pos, k_desc, v_desc, 0, 0, kc_head, vc_head,
                           stride_kct, stride_vct, bt_row, stride_kcb, stride_vcb, 0, tl.maximum(f_hi, c_lo),
                           ctx, lo, ctx, window, qk_scale, True, True, HAS_WINDOW, False, BS, HEAD_D, BLOCK_N)

    # ---- new keys: index n in [0, m_end), position ctx + n ----
    k_new = k_ptr + q_start.to(tl.int64) * stride_kt + hkv * stride_kh
    v_new = v_ptr + q_start.to(tl.int64) * stride_vt + hkv * stride_vh
    a_lo = tl.maximum(lo - ctx, 0) // BLOCK_N * BLOCK_N
    g_hi = (m_start + 1) // BLOCK_N * BLOCK_N                # tiles wholly at or before the first row
    if HAS_WINDOW:
        g_lo = tl.cdiv(tl.maximum(a_lo, m_end - window), BLOCK_N) * BLOCK_N
        g_lo = tl.minimum(g_lo, g_hi)
    else:
        g_lo = tl.minimum(a_lo, g_hi)
    hi = ctx + q_len
    col = hkv * HEAD_D
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, q_pos, k_desc, v_desc, q_start, col, k_new, v_new,
                           stride_kt, stride_vt, bt_row, 0, 0, ctx, a_lo, g_lo, lo, hi, window, qk_scale,
                           False, True, HAS_WINDOW, TMA, BS, HEAD_D, BLOCK_N)
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, q_pos, k_desc, v_desc, q_start, col, k_new, v_new,
                           stride_kt, stride_vt, bt_row, 0, 0, ctx, g_lo, g_hi, lo, hi, window, qk_scale,
                           False, False, HAS_WINDOW, TMA, BS, HEAD_D, BLOCK_N)
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, q_pos, k_desc, v_desc, q_start, col, k_new, v_new,
                           stride_kt, stride_vt, bt_row, 0, 0, ctx, tl.maximum(g_hi, a_lo), m_end, lo, hi,
                           window, qk_scale, False, True, HAS_WINDOW, TMA, BS, HEAD_D, BLOCK_N)

    # the sink joins the softmax once, after every key (p stays relative to the largest key score)
    sink = tl.load(sink_ptr + head).to(tl.float32) * 1.4426950408889634      # [BM]
    m_f = tl.maximum(m_i, sink)
    alpha = tl.math.exp2(m_i - m_f)
    l_i = l_i * alpha + tl.math.exp2(sink - m_f)
    out = acc * (alpha / l_i)[:, None]
    tl.store(o_ptr + rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def default_prefill_config(head_dim: int, window: int) -> dict:
    """Tile shape and launch parameters (measured on H200; see bench/NOTES.md)."""
    if window > 0:  # 8 tokens x 8 heads per tile: 135 of the 160 keys it scores are in the window
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3, PACK=True, TMA=True)
    if head_dim == 64:
        # 64 query rows x 128 keys: the O rescale (64 columns) and the loop's bookkeeping spread over
        # twice the scores (434 instead of 510 instructions per 64 scores per thread); capped at 168
        # registers so 3 programs share an SM (2 K/V stages: 75 KB of shared memory each). Session 4,
        # run 2: +3.1 / +4.5 / +3.9 % at 8k / 32k / 128k, +12 % chunked vs 128 x 64 (uncapped: -10 %)
        return dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2, maxnreg=168, PACK=False, TMA=True)
    return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, PACK=False, TMA=True)


def _tma_ok(t: torch.Tensor) -> bool:
    es = t.element_size()
    on_device = t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    return (on_device and t.stride(1) == t.shape[2] and t.data_ptr() % 16 == 0
            and (t.stride(0) * es) % 16 == 0 and t.shape[2] * es >= 16)


def no_cached_prefix(cached_lens, max_seqlen_k: int | None) -> bool:
    """Whether no sequence of the call has a cached prefix (the Gluon kernels' condition): ``max_seqlen_k == 0``
    (the largest cached length; the engine passes it) or, when the caller passes none, ``cached_lens`` all zero,
    read on the host (one device sync; False while a CUDA graph is being captured)."""
    if max_seqlen_k is None:
        if cached_lens.is_cuda and torch.cuda.is_current_stream_capturing():
            return False
        return not bool((cached_lens != 0).any())   # host sync
    return max_seqlen_k == 0


GLUON_ENV = "DAYZERO_PREFILL_GLUON"
# The Gluon configuration the registered op uses where it applies (session 5, bench/NOTES.md "Gluon prefill on
# the GPU"): 3 consumer warpgroups x 64 rows, 128-key tiles; +8 / +17 / +14 % over this kernel at 8k / 32k /
# 128k tokens in the same call. DAYZERO_PREFILL_GLUON=0 turns it off, =<config> picks another.
GLUON_DEFAULT = "pp3_nopin"


def gluon_prefill_choice(q, k, v, out, window: int, config: dict | None, cached_lens,
                         max_seqlen_k: int | None) -> str | None:
    """The ``gluon_attention_prefill`` configuration that runs this call, or None (this module's kernel).

    DAYZERO_PREFILL_GLUON names a configuration of ``gluon_attention_prefill.CONFIGS`` (default
    ``GLUON_DEFAULT``; "0" or empty: off; an unknown name: ValueError). The Gluon kernel runs the one case
    it supports and this kernel everything else: no tile config from the caller, full causal, head dim
    64, bf16, TMA-able rows, a Hopper GPU (sm_90), and no cached prefix: ``max_seqlen_k == 0`` (the
    largest cached length; the engine passes it), or, when the caller passes none, ``cached_lens`` all
    zero, read on the host (one device sync per call; never while a CUDA graph is being captured)."""
    name = os.environ.get(GLUON_ENV, GLUON_DEFAULT)
    if name in ("", "0"):
        return None
    from .gluon_attention_prefill import CONFIGS
    from .gluon_attention_schedule import check_supported

    if name not in CONFIGS:
        raise ValueError(f"{GLUON_ENV}={name!r} is not a Gluon prefill configuration ({', '.join(CONFIGS)})")
    if config or window != 0 or not q.is_cuda or q.shape[2] != 64 \
            or torch.cuda.get_device_capability(q.device) != (9, 0):
        return None
    try:
        check_supported(q, k, v, out, window, CONFIGS[name].block_n, CONFIGS[name].nwg)
    except ValueError:
        return None
    return name if no_cached_prefix(cached_lens, max_seqlen_k) else None


WINDOW_GLUON_ENV = "DAYZERO_WINDOW_GLUON"
# The Gluon sliding-window configuration the registered op's window path uses where it applies (session 6,
# bench/NOTES.md "Gluon window on the GPU (session 6)"). DAYZERO_WINDOW_GLUON=0 turns it off, =<config> picks
# another of gluon_attention_window.CONFIGS.
WINDOW_GLUON_DEFAULT = "pk3s"
WINDOW_GLUON_SIZE = 128     # the one window it is timed and wired for (gpt-oss sliding layers)


def gluon_window_choice(q, k, v, out, window: int, config: dict | None, cached_lens,
                        max_seqlen_k: int | None) -> str | None:
    """The ``gluon_attention_window`` configuration that runs this sliding-window prefill call, or None (the
    Triton window kernel). DAYZERO_WINDOW_GLUON names a configuration (default ``WINDOW_GLUON_DEFAULT``; "0" or
    empty: off; an unknown name: ValueError). The Gluon kernel runs only: no tile config from the caller, window
    128, head dim 64, bf16, TMA-able rows, the configuration's GQA group (8 for ``pk*``), a Hopper GPU (sm_90),
    no cached prefix (``max_seqlen_k == 0``; when not given, ``cached_lens`` all zero, read on the host: one
    sync, never while a CUDA graph is being captured)."""
    name = os.environ.get(WINDOW_GLUON_ENV, WINDOW_GLUON_DEFAULT)
    if name in ("", "0"):
        return None
    from .gluon_attention_window import CONFIGS, DIAG_CONFIGS, GluonWindowPackedConfig
    from .gluon_attention_window_schedule import check_window_supported

    if name not in CONFIGS or name in DIAG_CONFIGS:   # (the diagnostics write wrong output by design)
        raise ValueError(f"{WINDOW_GLUON_ENV}={name!r} is not a Gluon window configuration "
                         f"({', '.join(c for c in CONFIGS if c not in DIAG_CONFIGS)})")
    if config or window != WINDOW_GLUON_SIZE or not q.is_cuda or q.dim() != 3 or k.dim() != 3 \
            or torch.cuda.get_device_capability(q.device) != (9, 0):
        return None
    cfg = CONFIGS[name]
    group = q.shape[1] // max(k.shape[1], 1)
    packed = isinstance(cfg, GluonWindowPackedConfig)
    if (packed and group != 8) or (not packed and group % cfg.hpc):
        return None
    try:
        check_window_supported(q, k, v, out, window)
    except ValueError:
        return None
    return name if no_cached_prefix(cached_lens, max_seqlen_k) else None


def gluon_window_attention(name: str, q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                           scale: float, window: int, max_seqlen_q: int, out: torch.Tensor) -> torch.Tensor:
    """Run configuration ``name`` (from ``gluon_window_choice``: the call is already checked) into ``out``."""
    from .gluon_attention_window import CONFIGS, GluonWindowPackedConfig, window_attention
    from .gluon_attention_window_packed import window_packed_attention

    cfg = CONFIGS[name]
    if isinstance(cfg, GluonWindowPackedConfig):
        return window_packed_attention(q, k, v, cu_seqlens_q, sinks, scale, window, max_seqlen_q, out, cfg)
    return window_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, scale, window,
                            max_seqlen_q, out, config=cfg, check_prefix=False)


def prefill_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                      scale: float, window: int, max_seqlen_q: int, out: torch.Tensor,
                      config: dict | None = None, max_seqlen_k: int | None = None) -> torch.Tensor:
    """Launch the prefill kernel (or, where it applies, the Gluon one: ``gluon_prefill_choice``);
    ``max_seqlen_q`` sizes the grid. No device sync here, unless the Gluon kernel could apply and the
    caller does not pass ``max_seqlen_k`` (then ``cached_lens`` is read once on the host)."""
    gluon = gluon_prefill_choice(q, k, v, out, window, config, cached_lens, max_seqlen_k)
    if gluon is not None:
        from .gluon_attention_prefill import CONFIGS, prefill_attention as gluon_prefill

        return gluon_prefill(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, scale,
                             window, max_seqlen_q, out, config=CONFIGS[gluon], check_prefix=False)
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    B = cached_lens.shape[0]
    group = Hq // Hkv
    cfg = dict(default_prefill_config(D, window))
    if config and ("BLOCK_M" in config or "BLOCK_N" in config) and "maxnreg" not in config:
        cfg.pop("maxnreg", None)  # the default's register cap belongs to its tile shape
    cfg.update(config or {})
    if cfg.get("maxnreg", 0) is None:  # a config's maxnreg=None lifts the cap
        del cfg["maxnreg"]
    bm, bn = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
    pack, tma = cfg.pop("PACK", False), cfg.pop("TMA", False)
    if T == 0 or max_seqlen_q == 0:
        return out
    p = group if (pack and group & (group - 1) == 0 and bm % group == 0) else 1
    k_desc, v_desc = k, v
    tma = bool(tma and _tma_ok(k) and _tma_ok(v))
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k_desc = TensorDescriptor(k, [T, Hkv * D], [k.stride(0), 1], [bn, D])
        v_desc = TensorDescriptor(v, [T, Hkv * D], [v.stride(0), 1], [bn, D])
    args = (q, k, v, k_desc, v_desc, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables.stride(0), out.stride(0), out.stride(1), scale * LOG2E, window)
    consts = dict(GROUP=group, BS=k_cache.shape[1], HEAD_D=D, BLOCK_M=bm, BLOCK_N=bn, HAS_WINDOW=window > 0,
                  TMA=tma, **cfg)
    try:
        _prefill_kernel[(triton.cdiv(max_seqlen_q, bm // p), Hq // p, B)](*args, P=p, **consts)
    except PTXASError:
        if p == 1:
            raise
        # ptxas (CUDA 13.0) segfaults on some packed tile shapes (seen: full causal, 128 x 64, 4 warps);
        # the unpacked kernel computes the same function
        warnings.warn(f"attention prefill: ptxas failed on the GQA-packed {bm}x{bn} tile; using unpacked tiles",
                      RuntimeWarning, stacklevel=2)
        _prefill_kernel[(triton.cdiv(max_seqlen_q, bm), Hq, B)](*args, P=1, **consts)
    return out
