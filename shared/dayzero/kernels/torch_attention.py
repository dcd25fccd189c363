"""Torch reference for paged attention with per-head sinks (the oracle for GPU kernels).

Semantics shared by every backend:
  * a batch of B sequences; sequence b has ``cached_lens[b]`` tokens already in the paged cache
    and ``q_len_b = cu_seqlens_q[b+1] - cu_seqlens_q[b]`` new tokens whose q/k/v are passed in.
  * new token i of sequence b has position ``p = cached_lens[b] + i``; it attends to cached keys
    at positions [0, cached_lens[b]) and to the new keys at positions <= p (causal).
  * ``window > 0`` (sliding layers): key position j is visible only if ``p - j < window``.
  * the cache is read through ``block_tables[b, j // BS]`` (physical block of logical block j//BS).
    For sliding layers the engine may point logical blocks outside the window at anything: they
    are never read.
  * per head h: ``softmax([q.k_j * scale for visible j] ++ [sinks[h]])``; the sink's probability
    mass multiplies no value. GQA: query head h uses KV head ``h // (Hq // Hkv)``.
``attention`` does NOT store the new k/v; the caller does that with ``store_kv`` afterwards.
"""

from __future__ import annotations

import torch

from .registry import register


@register("torch", "attention")
def attention(
    q: torch.Tensor,             # [T, Hq, D]   new queries of all sequences, concatenated
    k: torch.Tensor,             # [T, Hkv, D]  new keys
    v: torch.Tensor,             # [T, Hkv, D]  new values
    k_cache: torch.Tensor,       # [NB, BS, Hkv, D]
    v_cache: torch.Tensor,       # [NB, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, MB] int32
    cu_seqlens_q: torch.Tensor,  # [B+1] int32
    cached_lens: torch.Tensor,   # [B] int32
    sinks: torch.Tensor,         # [Hq] float32
    scale: float,
    window: int = 0,
) -> torch.Tensor:               # [T, Hq, D]
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    BS = k_cache.shape[1]
    group = Hq // Hkv
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    cl = cached_lens.tolist()
    for b in range(len(cl)):
        s, e = cu[b], cu[b + 1]
        n_new, n_old = e - s, cl[b]
        if n_new == 0:
            continue
        first = 0
        if window > 0:  # oldest position any new query can see
            first = max(0, n_old - window + 1)
        if n_old > first:
            pos = torch.arange(first, n_old, device=q.device)
            blocks = block_tables[b].long()[pos // BS]
            kc = k_cache[blocks, pos % BS]  # [n, Hkv, D]
            vc = v_cache[blocks, pos % BS]
        else:
            kc = k.new_zeros((0, Hkv, D))
            vc = v.new_zeros((0, Hkv, D))
        kk = torch.cat([kc, k[s:e]], 0).float()  # [L, Hkv, D]
        vv = torch.cat([vc, v[s:e]], 0).float()
        key_pos = torch.arange(first, n_old + n_new, device=q.device)
        q_pos = torch.arange(n_old, n_old + n_new, device=q.device)
        kk = kk.repeat_interleave(group, dim=1)  # [L, Hq, D]
        vv = vv.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,lhd->htl", q[s:e].float(), kk) * scale  # [Hq, n_new, L]
        visible = key_pos[None, :] <= q_pos[:, None]
        if window > 0:
            visible &= (q_pos[:, None] - key_pos[None, :]) < window
        scores = scores.masked_fill(~visible[None], float("-inf"))
        sink = sinks.float().view(Hq, 1, 1).expand(Hq, n_new, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        out[s:e] = torch.einsum("htl,lhd->thd", probs, vv).to(q.dtype)
    return out


@register("torch", "store_kv")
def store_kv(
    k: torch.Tensor,             # [T, Hkv, D]
    v: torch.Tensor,             # [T, Hkv, D]
    k_cache: torch.Tensor,       # [NB, BS, Hkv, D]
    v_cache: torch.Tensor,       # [NB, BS, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64: physical_block * BS + offset; < 0 means skip
) -> None:
    BS = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache[slots // BS, slots % BS] = k[keep].to(k_cache.dtype)
    v_cache[slots // BS, slots % BS] = v[keep].to(v_cache.dtype)
