"""The tile schedule of the Gluon sliding-window prefill kernel (``gluon_attention_window``) in plain torch.

No triton here: CI (no GPU, no triton) checks ``emulate_window`` against the torch reference op, so the
kernel's index logic (which query rows a CTA and a warpgroup own, which 64-key tiles of the CTA's
resident window it loads and scores, which of them are masked and how, what TMA reads past a sequence or
past T, how the sink joins the softmax) is checked without a GPU. Gluon kernels cannot run in
TRITON_INTERPRET; keep this module in step with the kernel.

The schedule (head dim 64, window w <= 128, no cached prefix): a CTA owns some query heads of one KV head
and BM = 64 TB consecutive new tokens [m_start, m_start + BM) of one sequence; token block t holds rows
r0 = m_start + 64 t .. r0 + 63 (of every head of the CTA; which warpgroup takes which head does not change
the arithmetic). Every key any of its rows may see lies in [m_start - 128, m_start + BM), TB + 2 tiles of
64 keys; tile i holds keys [m_start - 128 + 64 i, + 64). Token block t scores exactly tiles t, t + 1, t + 2
(keys r0 - 128 .. r0 + 63): 192 scores per row for at most 128 visible keys.
  * tiles wholly before the sequence (i < 2 - m_start / 64: a sequence's first tiles) are neither loaded
    nor scored; tiles from the sequence's end on (first key >= q_len) are not loaded, and no live token
    block scores them;
  * the first tile a token block scores is masked both ways (key <= query and query - key < w): with
    w = 128 it is the window's edge (tile t) or, at a sequence's start, the middle / diagonal tile;
  * tile t + 1 (keys r0 - 64 .. r0 - 1: query - key in [1, 127]) is unmasked when w == 128 (masked both
    ways for a narrower window);
  * tile t + 2 (the diagonal) is masked both ways (the kernel's ``causal_diag`` tests key <= query only:
    the same set where the window spans the tile, w >= 64);
  * token blocks whose rows all lie past the sequence's end do nothing.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

import torch

from .gluon_attention_schedule import LOG2E, WM, _rows, check_tensors, finish_with_sink, online_step

MAX_WINDOW = 128  # two tiles of 64 keys before a warpgroup's first row
BN = 64           # keys per tile


@dataclass(frozen=True)
class WarpgroupTiles:
    """The key tiles (indices into the CTA's resident window) one token block's rows score, in order."""

    r0: int             # first query row (index in the sequence)
    tiles: list[int]    # tile indices, ascending; tile i holds keys [m_start - 128 + 64 i, + 64)
    masked: list[bool]  # per tile: masked (key <= query and query - key < window) or not


def cta_tiles(q_len: int, m_start: int, tb: int, window: int) -> tuple[int, int, list[WarpgroupTiles]]:
    """What the kernel's prologue computes for the CTA at ``m_start`` with ``tb`` token blocks: (first
    loaded tile, end of loaded tiles, per live token block its tiles)."""
    n_live = min(tb, -(-(q_len - m_start) // WM))
    i_lo = max(0, 2 - m_start // BN)
    i_hi = min(tb + 2, n_live + 2)
    wgs = []
    for g in range(n_live):
        i0 = max(g, i_lo)
        tiles = list(range(i0, g + 3))
        masked = [i == i0 or i == g + 2 or window < MAX_WINDOW for i in tiles]
        wgs.append(WarpgroupTiles(m_start + g * WM, tiles, masked))
    return i_lo, i_hi, wgs


def check_window_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           window: int) -> None:
    """Raise ValueError unless the Gluon window kernel supports this call (window 1..128, D 64, bf16,
    TMA-able rows)."""
    if not 0 < window <= MAX_WINDOW:
        raise ValueError(f"the Gluon window kernel needs a sliding window in [1, {MAX_WINDOW}] (got {window})")
    check_tensors("Gluon window", q, k, v, out)


def emulate_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   sinks: torch.Tensor, scale: float, window: int, tb: int = 2) -> torch.Tensor:
    """The kernel's computation, CTA by CTA (``tb`` token blocks each) and token block by token block, in
    float32 with P rounded to bf16 before the PV product: q [T, Hq, D], k/v [T, Hkv, D] (no cached prefix)
    -> [T, Hq, D] float32 (NaN where the kernel stores nothing)."""
    T, Hq, D = q.shape
    group = Hq // k.shape[1]
    out = torch.full((T, Hq, D), float("nan"))
    cu = cu_seqlens_q.tolist()
    qk_scale = scale * LOG2E
    for b in range(len(cu) - 1):
        q_start, q_len = cu[b], cu[b + 1] - cu[b]
        for m_start in range(0, q_len, WM * tb):
            _, _, wgs = cta_tiles(q_len, m_start, tb, window)
            for h in range(Hq):
                kv = h // group
                for wg in wgs:
                    qt = _rows(q[:, h].float(), q_start + wg.r0, WM)                    # [WM, D]
                    rows = torch.arange(wg.r0, wg.r0 + WM)
                    m = torch.full((WM, ), -1.0e30)
                    l_ = torch.zeros(WM)
                    o = torch.zeros(WM, D)
                    for i, masked in zip(wg.tiles, wg.masked):
                        base = m_start - 2 * BN + i * BN                               # >= 0 here
                        kt = _rows(k[:, kv].float(), q_start + base, BN)               # [BN, D]
                        vt = _rows(v[:, kv].float(), q_start + base, BN)
                        s = qt @ kt.T * qk_scale                                       # [WM, BN]
                        if masked:
                            cols = base + torch.arange(BN)
                            vis = (cols[None, :] <= rows[:, None]) & (rows[:, None] - cols[None, :] < window)
                            s = s.masked_fill(~vis, float("-inf"))
                        m, l_, o = online_step(m, l_, o, s, vt)
                    res = finish_with_sink(m, l_, o, float(sinks[h]))
                    keep = rows < q_len
                    out[q_start + rows[keep], h] = res[keep]
    return out


# ---- version 2 (``gluon_attention_window_packed``): GQA-packed 64-row units, one 144-key tile each ----
PK_TOK = 16     # tokens per unit (rows r -> token t0 + r % 16)
PK_HEADS = 4    # query heads per unit (rows r -> head r // 16)
PK_KEYS = 144   # keys a unit scores: [t0 - 128, t0 + 16)


def packed_chunk(max_seqlen_q: int, streams: int, sms: int, min_units: int, ups: int = 1) -> tuple[int, int]:
    """Units (of 16 tokens) per CTA, a multiple of ``ups`` (units a ring slot), and chunks per sequence: about
    one CTA per SM over ``streams`` = sequences x KV heads, at least ``min_units`` units a CTA."""
    n = -(-max_seqlen_q // PK_TOK)
    per = min(max(min_units, -(-n * streams // max(sms, 1))), max(n, 1))
    per = -(-per // ups) * ups
    return per, -(-n // per)


@functools.lru_cache(maxsize=None)   # (checked at every launch: a few hundred loop steps the first time only)
def ring_waits_every_phase(nc: int, stages: int, ups: int, n_slots: int = 96) -> bool:
    """Version 2's consumers wait for a slot's ``ready`` barrier by parity ((v // stages) & 1). A consumer
    warpgroup that skips a phase of a barrier it waits on (none of its items in slot v, items in slot v + stages)
    can pass the wait for slot v + stages while slot v is still loading (the barrier's current phase then has the
    other parity): it reads a slot not yet written and over-arrives on ``empty``. True when every warpgroup
    (items g, g + nc, ..., 2 ups items a slot) waits every phase of each barrier it waits on at all (nc = 2 keeps
    its quad: always; nc = 3 with one unit a slot: stages a multiple of 3)."""
    for g in range(nc):
        slots = sorted({i // (2 * ups) for i in range(g, 2 * ups * n_slots, nc)})
        for b in range(stages):
            mine = [v for v in slots if v % stages == b]
            if mine and mine != list(range(b, n_slots, stages))[:len(mine)]:
                return False
    return True


def kv_ring_holds_window(stages: int, ng: int = 16, n_units: int = 64) -> bool:
    """The ``kv_ring`` layout of ``gluon_attention_window_packed`` replayed on indices: local group lg (keys of unit
    lg - 8) goes to ring row lg % ng, rows 0-7 also to ng + lg % ng; the producer loads groups 0-7, then unit u's
    Q with group u + 8 once unit u - stages is released (in order). While unit v is the oldest unreleased, units
    v .. v + stages - 1 may be loaded and in process: each such unit u must find groups u .. u + 7 at rows
    u % ng .. u % ng + 7 (its window, one contiguous view) and group u + 8 at row (u + 8) % ng."""
    for v in range(n_units):
        rows = [-1] * (ng + 8)
        for lg in range(min(v + stages, n_units) + 8):           # every group loaded by then
            rows[lg % ng] = lg
            if lg % ng < 8:
                rows[ng + lg % ng] = lg
        for u in range(v, min(v + stages, n_units)):
            if rows[u % ng:u % ng + 8] != list(range(u, u + 8)) or rows[(u + 8) % ng] != u + 8:
                return False
    return True


def packed_bounds(t0: int, window: int, toff: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's mask of a unit at token t0 + toff of a ring slot whose keys start at t0 - 128: row r sees
    columns lo[r] <= c <= hi[r] (key t0 - 128 + c)."""
    rt = torch.arange(WM) % PK_TOK + toff
    lo = torch.clamp(rt + 129 - window, min=128 - t0)
    return lo, rt + 128


def emulate_window_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                          sinks: torch.Tensor, scale: float, window: int, ups: int = 1) -> torch.Tensor:
    """Version 2's computation item by item, in float32 with P rounded to bf16 before the PV product: a ring
    slot holds ``ups`` units (16 tokens each) and keys [t0 - 128, t0 + 16 ups), every unit of it scores all
    of them (masked as the kernel masks), keys read as TMA does (rows of the packed [T, Hkv, D] tensors, zeros
    below row 0 and past T), the sink in the row max before the exps. q [T, Hq, D] -> [T, Hq, D] float32 (NaN
    where the kernel stores nothing)."""
    T, Hq, D = q.shape
    hkv = k.shape[1]
    group = Hq // hkv
    nk = 128 + PK_TOK * ups
    out = torch.full((T, Hq, D), float("nan"))
    cu = cu_seqlens_q.tolist()
    qk_scale = scale * LOG2E
    cols = torch.arange(nk)
    for b in range(len(cu) - 1):
        q_start, q_len = cu[b], cu[b + 1] - cu[b]
        for t0 in range(0, q_len, PK_TOK * ups):                  # every ring slot
            first = q_start + t0 - 128
            pad = max(0, -first)
            for toff in range(0, PK_TOK * ups, PK_TOK):            # every unit of the slot
                lo, hi = packed_bounds(t0, window, toff)
                vis = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])     # [WM, nk]
                for kv in range(hkv):
                    kt = torch.cat([k.new_zeros(pad, D), _rows(k[:, kv], max(first, 0), nk - pad)]).float()
                    vt = torch.cat([v.new_zeros(pad, D), _rows(v[:, kv], max(first, 0), nk - pad)]).float()
                    for h4 in range(0, group, PK_HEADS):
                        heads = [kv * group + h4 + j for j in range(PK_HEADS)]
                        qt = torch.cat([_rows(q[:, h], q_start + t0 + toff, PK_TOK) for h in heads]).float()
                        s = (qt @ kt.T * qk_scale).masked_fill(~vis, float("-inf"))
                        sink = (sinks[heads].float() * LOG2E).repeat_interleave(PK_TOK)
                        m = torch.maximum(s.max(1).values, sink)
                        p = torch.exp2(s - m[:, None])
                        l_ = p.sum(1) + torch.exp2(sink - m)
                        res = (p.to(torch.bfloat16).float() @ vt) / l_[:, None]
                        tok = torch.arange(t0 + toff, t0 + toff + PK_TOK)
                        keep = tok < q_len
                        for j, h in enumerate(heads):
                            out[q_start + tok[keep], h] = res[j * PK_TOK:(j + 1) * PK_TOK][keep]
    return out
