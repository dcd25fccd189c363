"""Triton split-KV decode attention with sinks (one new token per sequence, paged cache).

Grid ``(num_splits, Hkv, B)``: one program reads one slice of one sequence's cached keys of one KV
head and serves all ``GROUP = Hq // Hkv`` query heads of that KV head at once (the group is the M
side of the tensor-core product, padded to 16), so each cached K/V byte is read once.
  * ``num_splits == 1``: the program also adds the new token's own key (from ``k``/``v``) and the
    sink, then writes the output. One launch.
  * ``num_splits > 1`` with ``MERGE="combine"`` (sliding-window layers, or opt-in): programs
    write partial ``(m, l, acc)`` per head; ``_combine_kernel`` merges the splits, then adds the new
    key and the sink (the sink exactly once), then writes.
  * ``num_splits > 1`` with ``MERGE="kernel"`` (full attention, default): triton_attention_splitkv.py.
Split boundaries are computed on the device from ``cached_lens`` (the same ``num_splits`` for every
sequence), so a launch needs no host sync and has a fixed shape per batch size: CUDA-graph safe.
``PDL`` (config): both kernels (this module's split + combine, or triton_attention_splitkv's split +
merge) are launched with programmatic dependent launch. The split kernel waits for its predecessor's
grid (``gdc_wait``) before reading anything, then lets the second kernel launch; that one reads what the
split kernel does not write, waits for the split kernel, then reads the partials. So the launch of each
kernel overlaps the previous one's tail; every read of a predecessor's output still comes after a wait.
``DEFAULT_PDL`` / ``DAYZERO_DECODE_PDL``: on wherever the KV is split (full and sliding layers; never
with one split, where the next kernel took SM slots from later waves), since run 10 on H200: B=1 1k / 8k
6.3 / 11.3 -> 5.2 / 10.6 µs, B=8 1k 11.0 -> 9.8, window B=1 / 8 5.0 / 6.2 -> 3.8 / 4.9. It was off in
sessions 3-4 because the engine's CUDA-graph and eager decode logits differed with it; run 10 showed the
decode step differs run to run with or without PDL (the small-M linear sums split-K partials with fp32
atomics in arrival order; with it at one split, PDL on and off give identical bits), and the PDL kernels
pass bitwise against their no-PDL twins (bench/NOTES.md "Session 5: decode and window").
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .triton_attention_splitkv import attend_new_and_sink, attend_tile, group_query, split_bounds, splitkv_decode
from .triton_attention_prefill import LOG2E
from .triton_moe_gemm import interpreting


@triton.jit
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, cl_ptr, sink_ptr,
                         o_ptr, mp_ptr, lp_ptr, op_ptr,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                         stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                         stride_bt, stride_ot, stride_oh,
                         qk_scale, window, num_splits,
                         GROUP: tl.constexpr, G_P2: tl.constexpr, BS: tl.constexpr,
                         HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
                         SINGLE: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # nothing is read before the previous grid is done; then the combine may launch
        gdc_wait()
        gdc_launch_dependents()
    s = tl.program_id(0)
    hkv = tl.program_id(1)
    b = tl.program_id(2)
    q_row = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_row
    if q_len == 0:
        return
    ctx = tl.load(cl_ptr + b)
    lo, start, stop = split_bounds(ctx, window, s, num_splits, HAS_WINDOW, BLOCK_N)
    offs_n = tl.arange(0, BLOCK_N)
    q, heads, g_ok, offs_g, offs_d, q_row64 = group_query(q_ptr, q_row, hkv, stride_qt, stride_qh,
                                                          GROUP, G_P2, HEAD_D)
    m_i = tl.zeros([G_P2], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([G_P2], dtype=tl.float32)
    acc = tl.zeros([G_P2, HEAD_D], dtype=tl.float32)

    kc_head = kc_ptr + hkv * stride_kch
    vc_head = vc_ptr + hkv * stride_vch
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for n0 in range(start, stop, BLOCK_N):
        pos = n0 + offs_n
        ok = (pos >= lo) & (pos < ctx)
        blk = tl.load(bt_row + pos // BS, mask=ok, other=0).to(tl.int64)
        m_i, l_i, acc = attend_tile(q, kc_head, vc_head, blk, (pos % BS).to(tl.int64), ok, offs_d, stride_kcb,
                                    stride_kct, stride_vcb, stride_vct, qk_scale, m_i, l_i, acc)

    if SINGLE:
        # the new token's own key/value (position ctx) and the sink, then normalise
        m_i, l_i, acc = attend_new_and_sink(q, k_ptr + q_row64 * stride_kt + hkv * stride_kh,
                                            v_ptr + q_row64 * stride_vt + hkv * stride_vh, offs_d,
                                            sink_ptr, heads, g_ok, qk_scale, m_i, l_i, acc)
        out = acc / l_i[:, None]
        tl.store(o_ptr + q_row64 * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=g_ok[:, None])
    else:
        # partials laid out [B, Hq, S] and [B, Hq, S, D]
        part = (b * tl.num_programs(1) * GROUP + heads).to(tl.int64) * num_splits + s   # [G]
        tl.store(mp_ptr + part, m_i, mask=g_ok)
        tl.store(lp_ptr + part, l_i, mask=g_ok)
        tl.store(op_ptr + part[:, None] * HEAD_D + offs_d[None, :], acc, mask=g_ok[:, None])


@triton.jit
def _combine_kernel(q_ptr, k_ptr, v_ptr, cu_ptr, sink_ptr, o_ptr, mp_ptr, lp_ptr, op_ptr,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ot, stride_oh, qk_scale, num_splits,
                    GROUP: tl.constexpr, HEAD_D: tl.constexpr, S_P2: tl.constexpr, PDL: tl.constexpr):
    h = tl.program_id(0)
    b = tl.program_id(1)
    q_row = tl.load(cu_ptr + b)
    if tl.load(cu_ptr + b + 1) == q_row:
        return
    hkv = h // GROUP
    offs_s = tl.arange(0, S_P2)
    offs_d = tl.arange(0, HEAD_D)
    s_ok = offs_s < num_splits
    part = (b * tl.num_programs(0) + h).to(tl.int64) * num_splits + offs_s          # [S]
    q_row64 = q_row.to(tl.int64)
    qv = tl.load(q_ptr + q_row64 * stride_qt + h * stride_qh + offs_d).to(tl.float32)
    kn = tl.load(k_ptr + q_row64 * stride_kt + hkv * stride_kh + offs_d).to(tl.float32)
    vn = tl.load(v_ptr + q_row64 * stride_vt + hkv * stride_vh + offs_d).to(tl.float32)
    sn = tl.sum(qv * kn, 0) * qk_scale
    sink = tl.load(sink_ptr + h).to(tl.float32) * 1.4426950408889634
    if PDL:  # the inputs above predate the split kernel (it waited for them); the partials do not
        gdc_wait()
        gdc_launch_dependents()
    m_s = tl.load(mp_ptr + part, mask=s_ok, other=float("-inf"))
    l_s = tl.load(lp_ptr + part, mask=s_ok, other=0.0)
    o_s = tl.load(op_ptr + part[:, None] * HEAD_D + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    m = tl.maximum(tl.maximum(tl.max(m_s, 0), sn), sink)
    w = tl.math.exp2(m_s - m)                                                       # [S]
    pn = tl.math.exp2(sn - m)
    l = tl.sum(l_s * w, 0) + pn + tl.math.exp2(sink - m)
    acc = tl.sum(o_s * w[:, None], 0) + pn * vn                                      # [D]
    tl.store(o_ptr + q_row64 * stride_ot + h * stride_oh + offs_d, (acc / l).to(o_ptr.dtype.element_ty))


def choose_num_splits(batch: int, num_kv_heads: int, max_kv_len: int, window: int = 0,
                      num_sms: int = 132) -> int:
    """Splits per sequence: one once the batch alone fills the SMs, else a power of two near 4
    programs per SM (odd counts leave a ragged last wave: 17 splits ran 14 % slower than 16 at
    B=8/128k; at B=8, 8 splits beat 16 at 1k-128k), at most 64 and at least 64 keys per split; above 32
    splits, at least 1024 keys per split (B=1 with PDL, runs 10-11 on H200: 32 splits beat 64 at 4k /
    8k / 16k, 7.4 / 9.7 / 14.4 vs 8.0 (16) / 10.6 / 15.0 us, tie at 32k, 64 best at 128k; bench/NOTES.md)."""
    kv = min(max_kv_len, window) if window > 0 else max_kv_len
    progs = batch * num_kv_heads
    if progs >= num_sms:
        return 1
    want = max(1, (4 * num_sms) // progs)
    want = 1 << (want.bit_length() - 1)  # round down to a power of two
    splits = int(max(1, min(64, want, triton.cdiv(max(kv, 1), 64))))
    if splits > 32:
        by_len = max(1, kv // 1024)
        splits = max(32, min(splits, 1 << (by_len.bit_length() - 1)))
    return splits


# full-attention decode with more than one split; DAYZERO_DECODE_ATTENTION=<name> picks another preset
# than the default (side-by-side benchmarks; the engine's GPU tests under each candidate)
DECODE_PRESETS = {
    "kernel_strided_n64": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64),   # default from run 9 to session 6
    "combine": {},                                                          # version 1 (the default before)
    "kernel": dict(MERGE="kernel", maxnreg=128),
    "kernel_strided_n64_s4": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, num_stages=4),
    # the same kernel with grid (Hkv, S, B): the KV heads of a split (which read the 8 128-byte pieces of the
    # same 1 KB token rows) launched side by side. Default since session 6 (call 2 on H200: 1.2-1.8 % faster
    # at B=1 8k / 32k / 128k and B=8 1k / 8k, e.g. B=1 / 32k 24.06 -> 23.78 us; decode and engine graph
    # tests passed under it); 128-key tiles: faster only at B=1 / 128k with 32 splits (72.97 us)
    "kernel_strided_n64_hm": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, HEAD_MAJOR=True),
    # candidate, never run on a GPU: split 0's new key / value / sink loads moved before the loop (sm_90: the
    # 2 dependent loads after the loop leave split 0's tail; same registers, 0 spills)
    "kernel_strided_n64_hm_en": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, HEAD_MAJOR=True, EARLY_NEW=True),
    # candidates, never run on a GPU (session 9, CPU only): the default preset with each split program's first 1 / 2
    # K/V tiles loaded before its PDL wait (EARLY_KV), and (_t) the merge letting the next PDL grid launch before
    # its own wait (EARLY_TRIGGER): triton_attention_splitkv's splitkv_decode
    "kernel_strided_n64_hm_ekv1": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, HEAD_MAJOR=True, EARLY_KV=1),
    "kernel_strided_n64_hm_ekv2": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, HEAD_MAJOR=True, EARLY_KV=2),
    "kernel_strided_n64_hm_ekv1t": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, HEAD_MAJOR=True, EARLY_KV=1,
                                        EARLY_TRIGGER=True),
    "kernel_strided_n64_hm_ekv2t": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, HEAD_MAJOR=True, EARLY_KV=2,
                                        EARLY_TRIGGER=True),
    "kernel_strided_n128": dict(MERGE="kernel", STRIDED=True, BLOCK_N=128),
    "kernel_strided_n128_hm": dict(MERGE="kernel", STRIDED=True, BLOCK_N=128, HEAD_MAJOR=True),
    # candidates, never run on a GPU (session 6, CPU only): K/V pages by TMA into an mbarrier ring, grid
    # (Hkv, S, B), the shipped merge (triton_attention_decode_tma.py); PAGES pages (16 keys each) a tile
    "tma_p4": dict(MERGE="kernel", TMA=True, PAGES=4, num_warps=4, num_stages=3),
    "tma_p4_s4": dict(MERGE="kernel", TMA=True, PAGES=4, num_warps=4, num_stages=4),
    "tma_p4_w1": dict(MERGE="kernel", TMA=True, PAGES=4, num_warps=1, num_stages=3),
    "tma_p4_w1_s4": dict(MERGE="kernel", TMA=True, PAGES=4, num_warps=1, num_stages=4),
    "tma_p2_w1_s4": dict(MERGE="kernel", TMA=True, PAGES=2, num_warps=1, num_stages=4),
}
DEFAULT_PRESET = "kernel_strided_n64_hm"
# full-attention decode with ONE split (B * Hkv >= the SM count); DAYZERO_DECODE_ONESPLIT=<name> picks
# another: "strided_*" run triton_attention_splitkv's kernel alone (pages one tile ahead, K/V double-buffered)
ONESPLIT_PRESETS = {
    "default": {},                                                          # this module's kernel, BLOCK_N 128
    "strided_n64": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64),
    "strided_n128_s2": dict(MERGE="kernel", STRIDED=True, BLOCK_N=128, num_stages=2),
    "strided_n64_hm": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, HEAD_MAJOR=True),
}
DEFAULT_ONESPLIT = "default"
# programmatic dependent launch where the KV is split (full and sliding layers): None = on when split,
# False = never; DAYZERO_DECODE_PDL=1 / 0 overrides (the engine's GPU tests under each)
DEFAULT_PDL: bool | None = None   # run 10: faster wherever the KV is split; engine graph tests 3/3 with it


def decode_pdl() -> bool | None:
    env = os.environ.get("DAYZERO_DECODE_PDL")
    if env is None:
        return DEFAULT_PDL
    if env not in ("0", "1"):
        raise ValueError(f"DAYZERO_DECODE_PDL={env!r}: choose 0 (off) or 1 (on where the KV is split)")
    return None if env == "1" else False


def default_decode_config(head_dim: int, window: int = 0, split: bool = True) -> dict:
    """``PDL``: programmatic dependent launch of both kernels (True), only when the KV is split (None), or
    never (False; ``decode_pdl()`` gives the default: see the module docstring). ``MERGE`` (more than one
    split): "kernel": triton_attention_splitkv.py (split kernel with the new key and sink in split 0,
    ``STRIDED`` tiles; then its ``_merge_kernel``), the default for full attention (run 9: faster at
    B = 1 and 8); "combine": this module's split kernel + ``_combine_kernel``, the default for
    sliding-window layers (2 splits: 5.1 vs 5.5 us at B=1 in run 9). One split (``split=False``):
    this module's kernel with its own tiles; the preset's tiles are the split-KV kernel's only (with
    them, one split ran BLOCK_N 64: 3.76 TB/s at B=256 / 128k in the closing call of session 4);
    ``MERGE="kernel", STRIDED=True`` in ``config`` runs triton_attention_splitkv's kernel instead."""
    pdl = decode_pdl()
    if window > 0:
        return dict(BLOCK_N=64, num_warps=4, num_stages=2, PDL=pdl, MERGE="combine")
    cfg = dict(BLOCK_N=128, num_warps=4, num_stages=3, PDL=pdl, MERGE="combine")
    env, presets, default = (("DAYZERO_DECODE_ATTENTION", DECODE_PRESETS, DEFAULT_PRESET) if split else
                             ("DAYZERO_DECODE_ONESPLIT", ONESPLIT_PRESETS, DEFAULT_ONESPLIT))
    preset = os.environ.get(env, default)
    if preset not in presets:
        raise ValueError(f"{env}={preset!r}: choose one of {', '.join(presets)}")
    cfg.update(presets[preset])
    return cfg


def decode_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                     scale: float, window: int, num_splits: int, out: torch.Tensor,
                     config: dict | None = None) -> torch.Tensor:
    """Launch split-KV decode (every sequence has at most one new token)."""
    cfg = dict(default_decode_config(q.shape[2], window, split=num_splits > 1))
    cfg.update(config or {})
    pdl = num_splits > 1 if cfg["PDL"] is None else bool(cfg["PDL"])
    merge = cfg.pop("MERGE")
    if merge not in ("combine", "kernel"):
        raise ValueError(f"decode attention: MERGE must be 'combine' or 'kernel', got {merge!r}")
    if not cfg.get("maxnreg", 1):
        cfg.pop("maxnreg")   # maxnreg=0: no cap
    if cfg.pop("TMA", False):   # opt-in TMA candidate (full attention on a dense cache; else the paths below)
        from .triton_attention_decode_tma import tma_decode, tma_supported
        if merge == "kernel" and tma_supported(k_cache, v_cache, window):
            tcfg = {key: cfg[key] for key in ("PAGES", "num_warps", "num_stages", "maxnreg") if key in cfg}
            return tma_decode(tcfg, num_splits, q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens,
                              sinks, scale * LOG2E, out, pdl=pdl)
        cfg.pop("PAGES", None)
    if merge == "kernel" and (num_splits > 1 or (cfg.get("STRIDED") and window == 0)):
        cfg.pop("PDL")
        return splitkv_decode(cfg, num_splits, q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q,
                              cached_lens, sinks, scale * LOG2E, window, out, pdl=pdl)
    plan = DecodePlan.make(q, k, cached_lens, num_splits, window, config)
    launch_split(plan, q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, scale,
                 window, out)
    if num_splits > 1:
        launch_combine(plan, q, k, v, cu_seqlens_q, sinks, scale, out)
    return out


class DecodePlan:
    """Launch parameters and fp32 partials of one decode call (split and combine launch separately
    so the benchmark can time them apart)."""

    def __init__(self, cfg: dict, group: int, num_splits: int, mp, lp, op):
        self.cfg, self.group, self.num_splits = cfg, group, num_splits
        self.mp, self.lp, self.op = mp, lp, op   # [B, Hq, S], [B, Hq, S], [B, Hq, S, D] (None: one split)

    @staticmethod
    def make(q, k, cached_lens, num_splits: int, window: int, config: dict | None) -> "DecodePlan":
        T, Hq, D = q.shape
        B = cached_lens.shape[0]
        cfg = dict(default_decode_config(D, window, split=False))   # this module's kernels
        cfg.update(config or {})
        for key in ("MERGE", "PART_BF16", "STRIDED", "HEAD_MAJOR", "EARLY_NEW", "EARLY_KV", "EARLY_TRIGGER"):
            cfg.pop(key, None)
        if not cfg.get("maxnreg", 1):
            cfg.pop("maxnreg")
        pdl = num_splits > 1 if cfg["PDL"] is None else bool(cfg["PDL"])
        cfg["PDL"] = pdl and not interpreting()   # no griddepcontrol on the CPU
        mp = lp = op = None
        if num_splits > 1:
            mp = torch.empty((B, Hq, num_splits), device=q.device, dtype=torch.float32)
            lp = torch.empty_like(mp)
            op = torch.empty((B, Hq, num_splits, D), device=q.device, dtype=torch.float32)
        return DecodePlan(cfg, Hq // k.shape[1], num_splits, mp, lp, op)


def launch_split(plan: DecodePlan, q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens,
                 sinks, scale: float, window: int, out: torch.Tensor):
    cfg = dict(plan.cfg)
    bn, pdl = cfg.pop("BLOCK_N"), cfg.pop("PDL")
    single = plan.num_splits == 1
    mp, lp, op = (out, out, out) if single else (plan.mp, plan.lp, plan.op)  # unused with one split
    extra = dict(launch_pdl=True) if pdl else {}
    return _decode_split_kernel[(plan.num_splits, k.shape[1], cached_lens.shape[0])](
        q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks, out, mp, lp, op,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        scale * LOG2E, window, plan.num_splits,
        GROUP=plan.group, G_P2=max(16, triton.next_power_of_2(plan.group)), BS=k_cache.shape[1],
        HEAD_D=q.shape[2], BLOCK_N=bn, HAS_WINDOW=window > 0, SINGLE=single, PDL=pdl, **cfg, **extra)


def launch_combine(plan: DecodePlan, q, k, v, cu_seqlens_q, sinks, scale: float, out: torch.Tensor):
    pdl = plan.cfg["PDL"]
    extra = dict(launch_pdl=True) if pdl else {}
    B, Hq = plan.mp.shape[0], q.shape[1]
    return _combine_kernel[(Hq, B)](
        q, k, v, cu_seqlens_q, sinks, out, plan.mp, plan.lp, plan.op,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), scale * LOG2E, plan.num_splits, GROUP=plan.group, HEAD_D=q.shape[2],
        S_P2=max(2, triton.next_power_of_2(plan.num_splits)), PDL=pdl, num_warps=1, **extra)
