"""The tile schedule of the Gluon ping-pong prefill kernel (``gluon_attention_prefill``) in plain torch.

No triton here: CI (no GPU, no triton) checks ``emulate`` against the torch reference op, so the
kernel's index logic (which query rows a CTA and a warpgroup own, which key tiles it walks, which of
them are masked, what TMA reads past a sequence or past T, how the sink joins the softmax) is checked
without a GPU. Gluon kernels cannot run in TRITON_INTERPRET, so this is the CPU check of that logic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOG2E = 1.4426950408889634
WM = 64      # query rows per consumer warpgroup
HEAD_D = 64  # the one head dim the kernel supports


@dataclass(frozen=True)
class CtaTiles:
    """The key tiles one CTA (query tile) walks: tile 0 (masked), [1, n_full) unmasked, then masked ones."""

    m_start: int   # first query index of the CTA within its sequence
    n_full: int    # tiles [0, n_full) are seen whole by every row of the CTA
    n_tiles: int   # tiles [0, n_tiles) cover keys [0, min(m_start + BM, q_len))


def tile_plan(q_len: int, block_m: int, block_n: int) -> list[CtaTiles]:
    """What the kernel's prologue computes for each query tile of a sequence of ``q_len`` new tokens."""
    plan = []
    for m_start in range(0, q_len, block_m):
        m_end = min(m_start + block_m, q_len)
        plan.append(CtaTiles(m_start, (m_start + 1) // block_n, -(-m_end // block_n)))
    return plan


def check_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, window: int,
                    block_n: int, nwg: int) -> None:
    """Raise ValueError unless the kernel supports this call (full causal, D 64, bf16, TMA-able rows)."""
    if window != 0:
        raise ValueError(f"the Gluon prefill kernel is full causal only (window {window})")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or q.shape[2] != HEAD_D or k.shape[2] != HEAD_D \
            or v.shape != k.shape or q.shape[0] != k.shape[0]:
        raise ValueError(f"the Gluon prefill kernel needs q [T, Hq, 64], k/v [T, Hkv, 64]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of KV heads {k.shape[1]}")
    if any(t.dtype != torch.bfloat16 for t in (q, k, v, out)):
        raise ValueError("the Gluon prefill kernel needs bf16 q, k, v and out")
    if out.shape != q.shape or out.stride(2) != 1:
        raise ValueError(f"out must be [T, Hq, 64] with contiguous rows, got {tuple(out.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(2) != 1 or t.stride(1) != HEAD_D or (t.stride(0) * 2) % 16 or t.data_ptr() % 16:
            raise ValueError(f"{name} must have contiguous [H, 64] rows at 16-byte aligned strides (TMA)")
    if block_n not in (64, 128) or nwg not in (2, 3):
        raise ValueError(f"block_n must be 64 or 128 and nwg 2 or 3 (got {block_n}, {nwg})")


def _rows(t: torch.Tensor, first: int, n: int) -> torch.Tensor:
    """Rows [first, first + n) of t [T, ...] as TMA reads them: zero past T (``first`` >= 0 here)."""
    blk = t.new_zeros((n, ) + tuple(t.shape[1:]))
    stop = min(first + n, t.shape[0])
    if stop > first:
        blk[:stop - first] = t[first:stop]
    return blk


def emulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, sinks: torch.Tensor,
            scale: float, nwg: int = 2, block_n: int = 128) -> torch.Tensor:
    """The kernel's computation, CTA by CTA and warpgroup by warpgroup, in float32 with P rounded to
    bf16 before the PV product: q [T, Hq, D], k/v [T, Hkv, D] (no cached prefix) -> [T, Hq, D] float32.
    Rows past a sequence's end are computed from what TMA reads there (next sequence / zeros) and
    dropped at the store, as in the kernel."""
    T, Hq, D = q.shape
    group = Hq // k.shape[1]
    out = torch.full((T, Hq, D), float("nan"))
    cu = cu_seqlens_q.tolist()
    qk_scale = scale * LOG2E
    bm = WM * nwg
    for b in range(len(cu) - 1):
        q_start, q_len = cu[b], cu[b + 1] - cu[b]
        for cta in tile_plan(q_len, bm, block_n):
            for h in range(Hq):
                kv = h // group
                for wg in range(nwg):
                    r0 = cta.m_start + wg * WM
                    qt = _rows(q[:, h].float(), q_start + r0, WM)               # [WM, D]
                    rows = torch.arange(r0, r0 + WM)
                    m = torch.full((WM, ), -1.0e30)
                    l_ = torch.zeros(WM)
                    o = torch.zeros(WM, D)
                    for j in range(cta.n_tiles):
                        kt = _rows(k[:, kv].float(), q_start + j * block_n, block_n)  # [BN, D]
                        vt = _rows(v[:, kv].float(), q_start + j * block_n, block_n)
                        s = qt @ kt.T * qk_scale                                   # [WM, BN]
                        if j == 0 or j >= cta.n_full:                              # masked tiles
                            cols = j * block_n + torch.arange(block_n)
                            s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
                        m_new = torch.maximum(m, s.max(1).values)
                        p = torch.exp2(s - m_new[:, None])
                        alpha = torch.exp2(m - m_new)
                        l_ = l_ * alpha + p.sum(1)
                        o = o * alpha[:, None] + p.to(torch.bfloat16).float() @ vt
                        m = m_new
                    sink = float(sinks[h]) * LOG2E
                    m_f = torch.clamp(m, min=sink)
                    alpha = torch.exp2(m - m_f)
                    l_ = l_ * alpha + torch.exp2(sink - m_f)
                    res = o * (alpha / l_)[:, None]
                    keep = rows < q_len
                    out[q_start + rows[keep], h] = res[keep]
    return out
