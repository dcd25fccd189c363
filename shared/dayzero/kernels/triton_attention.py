"""Triton backend for ``attention`` and ``store_kv`` (contract: kernels/torch_attention.py).

``attention`` picks one of two kernels:
  * decode (every sequence has at most one new token): split-KV flash decoding, GQA heads batched
    per program, the sink counted once when splits are merged (triton_attention_decode.py; with
    more than one split on full-attention layers its split + merge kernels in
    triton_attention_splitkv.py);
  * otherwise prefill / chunked prefill / mixed batches: for sliding-window layers (window <= 256,
    power-of-two GQA group) the loop-free window kernel (triton_attention_window.py), else the
    flash kernel (triton_attention_prefill.py). ``config={"KERNEL": "flash"}`` forces the latter.
    Window-128 prefill without a cached prefix (D 64, bf16, GQA group 8, sm_90, no config) runs the Gluon
    window kernel instead (``triton_attention_prefill.gluon_window_choice``; DAYZERO_WINDOW_GLUON=0: off).
Optional keyword arguments make a call free of host syncs (needed inside CUDA graphs):
``max_seqlen_q`` (largest new-token count; sizes the grid and picks the kernel) and, for decode,
``num_splits`` or ``max_seqlen_k`` (largest cached length, used to choose ``num_splits``). Without
them the launcher reads the lengths from the device once. ``out`` may be given to write in place.
"""

from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources, PTXASError

from .registry import register
from .triton_attention_decode import choose_num_splits, decode_attention
from .triton_attention_prefill import gluon_window_attention, gluon_window_choice, prefill_attention
from .triton_attention_window import window_attention, window_supported

# which prefill kernel serves sliding-window layers unless config["KERNEL"] says otherwise
# (run 6 on H200: the window kernel 102 / 373 µs at 8k / 32k, TMA from 4096 new tokens; flash 141 / 538)
WINDOW_PREFILL_KERNEL = "window"


def _check(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError("attention: q/k/v must be [T, H, D] and k_cache/v_cache [NB, BS, Hkv, D]")
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    if k.shape != (T, Hkv, D) or v.shape != (T, Hkv, D):
        raise ValueError(f"attention: k {tuple(k.shape)} / v {tuple(v.shape)} must be ({T}, Hkv, {D})")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"attention: {Hq} query heads is not a multiple of {Hkv} KV heads")
    if k_cache.shape[2:] != (Hkv, D) or v_cache.shape != k_cache.shape:
        raise ValueError(f"attention: caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} "
                         f"do not match [NB, BS, {Hkv}, {D}]")
    bs = k_cache.shape[1]
    if D < 16 or D > 256 or D & (D - 1) or bs & (bs - 1):
        raise ValueError(f"attention (triton): head dim {D} must be a power of two in [16, 256] "
                         f"and block size {bs} a power of two")
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"attention (triton): {name} must be contiguous in its last dimension")
    B = cached_lens.shape[0]
    if cu_seqlens_q.shape != (B + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != B:
        raise ValueError("attention: cu_seqlens_q must be [B+1] and block_tables [B, MB] for B = len(cached_lens)")
    for name, t in (("block_tables", block_tables), ("cu_seqlens_q", cu_seqlens_q), ("cached_lens", cached_lens)):
        if t.dtype != torch.int32:
            raise ValueError(f"attention: {name} must be int32, got {t.dtype}")
    if sinks.shape != (Hq,):
        raise ValueError(f"attention: sinks must be [{Hq}], got {tuple(sinks.shape)}")
    if block_tables.stride(-1) != 1:
        raise ValueError("attention (triton): block_tables must be contiguous in its last dimension")


@register("triton", "attention")
def attention(
    q: torch.Tensor,             # [T, Hq, D]
    k: torch.Tensor,             # [T, Hkv, D]
    v: torch.Tensor,             # [T, Hkv, D]
    k_cache: torch.Tensor,       # [NB, BS, Hkv, D]
    v_cache: torch.Tensor,       # [NB, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, MB] int32
    cu_seqlens_q: torch.Tensor,  # [B+1] int32
    cached_lens: torch.Tensor,   # [B] int32
    sinks: torch.Tensor,         # [Hq] float32
    scale: float,
    window: int = 0,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:               # [T, Hq, D]
    _check(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"attention: out must be {tuple(q.shape)} and contiguous in its last dimension")
    if q.shape[0] == 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())  # host sync
    if max_seqlen_q <= 1:
        if num_splits is None:
            if max_seqlen_k is None:
                max_seqlen_k = int(cached_lens.max().item())  # host sync
            num_splits = choose_num_splits(cached_lens.shape[0], k.shape[1], max_seqlen_k, window,
                                           num_sms=_num_sms(q.device))
        return decode_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens,
                                sinks, scale, window, num_splits, out, config)
    if window > 0 and not config:  # the Gluon window kernel where it applies (DAYZERO_WINDOW_GLUON)
        gluon = gluon_window_choice(q, k, v, out, window, config, cached_lens, max_seqlen_k)
        if gluon is not None:
            return gluon_window_attention(gluon, q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens,
                                          sinks, scale, window, max_seqlen_q, out)
    config = dict(config or {})
    kernel = config.pop("KERNEL", WINDOW_PREFILL_KERNEL if window > 0 else "flash")
    if kernel not in ("window", "flash"):
        raise ValueError(f"attention (triton): unknown prefill kernel {kernel!r}")
    if kernel == "window":
        if window_supported(window, q.shape[1] // k.shape[1]):
            try:
                window_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens,
                                 sinks, scale, window, max_seqlen_q, out, config)
                return out
            except (PTXASError, OutOfResources):
                # ptxas (CUDA 13.0) has crashed on some tile shapes, and a wide window at a large head
                # dim may not fit; the flash kernel computes the same function
                warnings.warn("attention: the window kernel did not build; using the flash kernel",
                              RuntimeWarning, stacklevel=2)
        config = {}  # full attention, a wide window or an odd GQA group: the flash kernel's defaults
    return prefill_attention(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, cached_lens, sinks,
                             scale, window, max_seqlen_q, out, config, max_seqlen_k=max_seqlen_k)


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                     HKV: tl.constexpr, H_P2: tl.constexpr, HEAD_D: tl.constexpr, BS: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    blk = slot // BS
    off = slot % BS
    hh = tl.arange(0, H_P2)
    dd = tl.arange(0, HEAD_D)
    m = (hh < HKV)[:, None]
    t64 = t.to(tl.int64)
    kv = tl.load(k_ptr + t64 * stride_kt + hh[:, None] * stride_kh + dd[None, :], mask=m)
    vv = tl.load(v_ptr + t64 * stride_vt + hh[:, None] * stride_vh + dd[None, :], mask=m)
    tl.store(kc_ptr + blk * stride_kcb + off * stride_kct + hh[:, None] * stride_kch + dd[None, :],
             kv.to(kc_ptr.dtype.element_ty), mask=m)
    tl.store(vc_ptr + blk * stride_vcb + off * stride_vct + hh[:, None] * stride_vch + dd[None, :],
             vv.to(vc_ptr.dtype.element_ty), mask=m)


@register("triton", "store_kv")
def store_kv(
    k: torch.Tensor,             # [T, Hkv, D]
    v: torch.Tensor,             # [T, Hkv, D]
    k_cache: torch.Tensor,       # [NB, BS, Hkv, D]
    v_cache: torch.Tensor,       # [NB, BS, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64: physical_block * BS + offset; < 0 means skip
) -> None:
    T, Hkv, D = k.shape
    if v.shape != k.shape or k_cache.shape[2:] != (Hkv, D) or v_cache.shape != k_cache.shape:
        raise ValueError(f"store_kv: k/v {tuple(k.shape)} do not match caches {tuple(k_cache.shape)}")
    if slot_mapping.shape != (T,):
        raise ValueError(f"store_kv: slot_mapping must be [{T}], got {tuple(slot_mapping.shape)}")
    if D & (D - 1) or k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("store_kv (triton): head dim must be a power of two and last dims contiguous")
    if T == 0:
        return
    _store_kv_kernel[(T,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HKV=Hkv, H_P2=triton.next_power_of_2(Hkv), HEAD_D=D, BS=k_cache.shape[1], num_warps=2)
