"""Fused MoE for decode-sized batches (T * top-k <= 256 pairs): two or three launches, no alignment pass.

The large-M pipeline (``triton_moe``) sorts pairs by expert in three launches, then runs two grouped
GEMMs and a combine: six launches whose fixed costs dominate at 1-64 tokens. Here:
  1. ``gate_up``: program (slot s, N tile). Slot s is the s-th smallest local expert that any pair
     routes to, found in-kernel from a histogram of the ids (slots past the last touched expert exit
     at once). The program gathers that expert's tokens (ascending token order; a token routes to an
     expert at most once) as the M side of the dot, in chunks of BM rows, and streams its FP8 weight
     tile once per chunk (one chunk unless an expert has more than BM tokens). Epilogue: ``+ b1``,
     rounded to bf16 like the reference, clamped SwiGLU on the interleaved gate (even) / up (odd)
     columns -> h [P, I] bf16, row = pair id (token * k + slot).
  2. ``down``: same slot/row mapping over h; epilogue ``(acc + b2) * routing weight`` -> y [P, H]
     fp32. With ``fused_combine`` every program then counts its rows in per (token, N tile) arrival
     counters (zeroed by gate_up); the program that completes a token's count sums that token's y
     rows in route order (fixed order: deterministic) and writes out[t] bf16. Tokens with no local
     route are written as zeros. Without it (the default: faster in runs 1-2) a third launch does the
     same combine.
Activations stay bf16 (weight-only: each FP8 tile widened to bf16 in registers, block scale applied
per 128-wide K step), so there is no activation quantization error at all; tests bound the error by
the reference's own FP8 emulation error. Expert parallel: ``experts.derived["expert_offset"]``.
Static shapes for a given T and no host syncs: CUDA-graph capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .types import ExpertWeights

SWIGLU_ALPHA = 1.702
# T * k up to which the registered triton op takes this path: T = 1 at top-4. Runs 1-2 (CUDA graphs):
# 3-4 % faster than the aligned path at T = 1, slower from T = 2 on (bench/NOTES.md "MoE decode")
DECODE_MAX_PAIRS = 4
BK = 128                # one weight scale block per K step


@dataclass(frozen=True)
class SmallTiles:
    """Launch configuration: M rows per dot, N columns per program (each divides 128), warps, stages,
    and whether down does the combine itself (two launches) or a third launch does (run 1: the
    separate combine was 3-5 % faster than the arrival counters at every T)."""

    bm: int = 16
    bn_gate_up: int = 32
    bn_down: int = 32
    warps: int = 4
    stages: int = 4
    fused_combine: bool = False


def default_tiles(T: int) -> SmallTiles:
    return SmallTiles()  # run 1: bm 16 beat bm 32 at T = 64 (428 vs 800 us); N tiles re-measured in run 2


def interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _slot_expert(ids_ptr, s, T, offset, E, TOPK: tl.constexpr, PB: tl.constexpr, EB: tl.constexpr):
    """Local expert of slot s (the s-th smallest touched local id), -1 when fewer are touched."""
    i = tl.arange(0, PB)
    ok = i < T * TOPK
    e = tl.load(ids_ptr + i, mask=ok, other=-1).to(tl.int32) - offset
    e = tl.where(ok & (e >= 0) & (e < E), e, E)                      # bin E: not on this rank
    ex = tl.arange(0, EB)
    present = (tl.histogram(e, EB) > 0) & (ex < E)
    rank = tl.cumsum(present.to(tl.int32), 0) - 1
    return tl.max(tl.where(present & (rank == s), ex, -1), 0)


@triton.jit
def _expert_tokens(ids_ptr, e, T, offset, TOPK: tl.constexpr, TB: tl.constexpr, KP: tl.constexpr):
    """Per token t [TB]: routes to local expert e (0/1), its slot j there, rank among those tokens."""
    t = tl.arange(0, TB)
    j = tl.arange(0, KP)
    ok = (t < T)[:, None] & (j < TOPK)[None, :]
    ids = tl.load(ids_ptr + t[:, None] * TOPK + j[None, :], mask=ok, other=-1).to(tl.int32) - offset
    match = ok & (ids == e)
    tin = tl.sum(match.to(tl.int32), 1)
    jsel = tl.sum(tl.where(match, j[None, :], 0), 1)
    return tin, jsel, tl.cumsum(tin, 0) - 1, tl.sum(tin, 0)


@triton.jit
def _rows(tin, jsel, rank, cnt, c, TOPK: tl.constexpr, TB: tl.constexpr, BM: tl.constexpr):
    """Rows c .. c+BM of the expert's token list -> (token [BM], pair id [BM], row valid [BM])."""
    m = c + tl.arange(0, BM)
    sel = (tin > 0)[None, :] & (rank[None, :] == m[:, None])          # [BM, TB]
    tok = tl.sum(tl.where(sel, tl.arange(0, TB)[None, :], 0), 1)
    pair = tok * TOPK + tl.sum(tl.where(sel, jsel[None, :], 0), 1)
    return tok, pair, m < cnt


@triton.jit
def _stream(a_ptrs, row_ok, b_ptrs, s_ptr, n_ok, K, BM: tl.constexpr, BN: tl.constexpr,
            BK_: tl.constexpr, KBP: tl.constexpr, DOT_F32: tl.constexpr):
    """acc [BM, BN] = A [BM, K] (bf16 rows) @ (fp8 tile [K, BN] * its 128x128 block scales)."""
    offs_k = tl.arange(0, BK_)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    # all block scales of the tile's K row up front (registers); a scale load in the step that uses
    # it stalls every step on an L2 round trip before the next tiles' copies are issued (run 1)
    nkb = tl.cdiv(K, BK_)
    kidx = tl.arange(0, KBP)
    svec = tl.load(s_ptr + kidx, mask=kidx < nkb, other=0.0)
    for kb in range(0, nkb):
        k_ok = offs_k < K - kb * BK_
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        sb = tl.sum(tl.where(kidx == kb, svec, 0.0), 0)
        if DOT_F32:  # the CPU interpreter mis-multiplies bf16 dots
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32)) * sb
        else:
            acc += tl.dot(a, b.to(tl.bfloat16)) * sb
        a_ptrs += BK_
        b_ptrs += BK_
    return acc


@triton.jit
def _gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, h_ptr, cnt_ptr,
                    T, K, N, E, offset, n_tiles, cnt_total,
                    stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_h,
                    limit, alpha,
                    TOPK: tl.constexpr, TB: tl.constexpr, KP: tl.constexpr, EB: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK_: tl.constexpr, KBP: tl.constexpr,
                    DOT_F32: tl.constexpr):
    pid = tl.program_id(0)
    s = pid // n_tiles
    pid_n = pid % n_tiles
    if s == 0:  # zero the down kernel's arrival counters (cnt_total = 0 without the fused combine)
        for z0 in range(pid_n * 64, cnt_total, n_tiles * 64):
            z = z0 + tl.arange(0, 64)
            tl.store(cnt_ptr + z, tl.zeros((64,), tl.int32), mask=z < cnt_total)
    e = _slot_expert(ids_ptr, s, T, offset, E, TOPK, TB * KP, EB)
    if e < 0:
        return
    tin, jsel, rank, cnt = _expert_tokens(ids_ptr, e, T, offset, TOPK, TB, KP)
    e64 = e.to(tl.int64)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    offs_nc = tl.where(n_ok, offs_n, 0)
    offs_k = tl.arange(0, BK_)
    b_ptrs = w_ptr + e64 * stride_we + offs_nc[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    sc_ptr = s_ptr + e64 * stride_se + ((pid_n * BN) // 128) * stride_sn
    bias = tl.load(b_ptr + e64 * stride_be + offs_nc, mask=n_ok, other=0.0).to(tl.float32)
    offs_h = pid_n * (BN // 2) + tl.arange(0, BN // 2)
    for c in range(0, cnt, BM):
        tok, pair, row_ok = _rows(tin, jsel, rank, cnt, c, TOPK, TB, BM)
        a_ptrs = x_ptr + tok.to(tl.int64)[:, None] * stride_x + offs_k[None, :]
        acc = _stream(a_ptrs, row_ok, b_ptrs, sc_ptr, n_ok, K, BM, BN, BK_, KBP, DOT_F32)
        v = (acc + bias[None, :]).to(tl.bfloat16).to(tl.float32)        # gate_up rounded like the reference
        gate, up = tl.split(tl.reshape(v, (BM, BN // 2, 2)))
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        h = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
        tl.store(h_ptr + pair.to(tl.int64)[:, None] * stride_h + offs_h[None, :], h.to(tl.bfloat16),
                 mask=row_ok[:, None] & (offs_h < N // 2)[None, :])


@triton.jit
def _down_kernel(h_ptr, ids_ptr, wt_ptr, w_ptr, s_ptr, b_ptr, y_ptr, out_ptr, cnt_ptr,
                 T, K, N, E, offset, n_tiles,
                 stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_y, stride_o,
                 TOPK: tl.constexpr, TB: tl.constexpr, KP: tl.constexpr, EB: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK_: tl.constexpr, KBP: tl.constexpr, FUSED: tl.constexpr,
                 DOT_F32: tl.constexpr):
    pid = tl.program_id(0)
    s = pid // n_tiles
    pid_n = pid % n_tiles
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    offs_nc = tl.where(n_ok, offs_n, 0)
    if FUSED:
        if s == 0:  # tokens with no route to this rank: nobody completes them, write zeros
            t = tl.arange(0, TB)
            jj = tl.arange(0, KP)
            okt = (t < T)[:, None] & (jj < TOPK)[None, :]
            le = tl.load(ids_ptr + t[:, None] * TOPK + jj[None, :], mask=okt, other=-1).to(tl.int32) - offset
            need = tl.sum((okt & (le >= 0) & (le < E)).to(tl.int32), 1)
            zmask = ((t < T) & (need == 0))[:, None] & n_ok[None, :]
            tl.store(out_ptr + t.to(tl.int64)[:, None] * stride_o + offs_n[None, :],
                     tl.zeros((TB, BN), tl.float32).to(out_ptr.dtype.element_ty), mask=zmask)
    e = _slot_expert(ids_ptr, s, T, offset, E, TOPK, TB * KP, EB)
    if e < 0:
        return
    tin, jsel, rank, cnt = _expert_tokens(ids_ptr, e, T, offset, TOPK, TB, KP)
    e64 = e.to(tl.int64)
    offs_k = tl.arange(0, BK_)
    b_ptrs = w_ptr + e64 * stride_we + offs_nc[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    sc_ptr = s_ptr + e64 * stride_se + ((pid_n * BN) // 128) * stride_sn
    bias = tl.load(b_ptr + e64 * stride_be + offs_nc, mask=n_ok, other=0.0).to(tl.float32)
    for c in range(0, cnt, BM):
        tok, pair, row_ok = _rows(tin, jsel, rank, cnt, c, TOPK, TB, BM)
        a_ptrs = h_ptr + pair.to(tl.int64)[:, None] * stride_h + offs_k[None, :]
        acc = _stream(a_ptrs, row_ok, b_ptrs, sc_ptr, n_ok, K, BM, BN, BK_, KBP, DOT_F32)
        wt = tl.load(wt_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
        y = (acc + bias[None, :]) * wt[:, None]
        tile_ok = row_ok[:, None] & n_ok[None, :]
        tl.store(y_ptr + pair.to(tl.int64)[:, None] * stride_y + offs_n[None, :], y, mask=tile_ok)
        if FUSED:
            tl.debug_barrier()                                   # the whole y tile is stored ...
            old = tl.atomic_add(cnt_ptr + tok * n_tiles + pid_n, 1, mask=row_ok)  # ... before it counts
            need = tl.zeros((BM,), tl.int32)
            for j in tl.static_range(TOPK):
                ej = tl.load(ids_ptr + tok * TOPK + j, mask=row_ok, other=-1).to(tl.int32) - offset
                need += ((ej >= 0) & (ej < E)).to(tl.int32)
            last = row_ok & (old + 1 == need)
            tl.debug_barrier()
            tot = tl.zeros((BM, BN), dtype=tl.float32)
            for j in tl.static_range(TOPK):                      # route order: same sum whoever is last
                ej = tl.load(ids_ptr + tok * TOPK + j, mask=last, other=-1).to(tl.int32) - offset
                okj = last & (ej >= 0) & (ej < E)
                tot += tl.load(y_ptr + (tok * TOPK + j).to(tl.int64)[:, None] * stride_y + offs_n[None, :],
                               mask=okj[:, None] & n_ok[None, :], other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + tok.to(tl.int64)[:, None] * stride_o + offs_n[None, :],
                     tot.to(out_ptr.dtype.element_ty), mask=last[:, None] & n_ok[None, :])


@triton.jit
def _combine_kernel(y_ptr, ids_ptr, out_ptr, H, offset, E, stride_y, stride_o,
                    TOPK: tl.constexpr, BH: tl.constexpr):
    """out[t] = sum over t's local routes j (in order) of y[t * TOPK + j] (fp32), every row written."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    ok = cols < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + j).to(tl.int32) - offset
        if (e >= 0) & (e < E):
            acc += tl.load(y_ptr + (t * TOPK + j) * stride_y + cols, mask=ok, other=0.0)
    tl.store(out_ptr + t * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _kblocks(K: int) -> int:
    return triton.next_power_of_2(triton.cdiv(K, BK))


class MoeSmall:
    """One decode MoE call: buffers allocated here, ``gate_up``, ``down`` (and ``combine`` without the
    fused combine) re-runnable on them; ``__call__`` runs them in order and returns out [T, H]."""

    def __init__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                 limit: float, tiles: SmallTiles | None = None) -> None:
        T, H = x.shape
        E, two_i, h_in = experts.gate_up.shape
        I = two_i // 2
        if h_in != H or experts.down.shape != (E, H, I) or weights.shape != ids.shape or ids.shape[0] != T:
            raise ValueError(f"moe shapes disagree: x {tuple(x.shape)}, ids {tuple(ids.shape)}, weights "
                             f"{tuple(weights.shape)}, gate_up {tuple(experts.gate_up.shape)}, "
                             f"down {tuple(experts.down.shape)}")
        if experts.gate_up_scale is None or experts.down_scale is None:
            raise ValueError("the small-T MoE path needs fp8 experts with gate_up_scale and down_scale")
        if x.dtype != torch.bfloat16:
            raise ValueError(f"the small-T MoE path takes bf16 activations, got {x.dtype}")
        self.tiles = t = tiles or default_tiles(T)
        for bn in (t.bn_gate_up, t.bn_down):
            if bn < 16 or 128 % bn:
                raise ValueError(f"N tile {bn} must divide 128 and be >= 16")
        self.T, self.H, self.I, self.E, self.k = T, H, I, E, ids.shape[1]
        self.x, self.ids, self.weights, self.ex, self.limit = (x.contiguous(), ids.contiguous(),
                                                               weights.contiguous(), experts, float(limit))
        self.offset = int(experts.derived.get("expert_offset", 0))
        P, dev = T * self.k, x.device
        self.slots = min(P, E)
        self.nt1, self.nt2 = triton.cdiv(2 * I, t.bn_gate_up), triton.cdiv(H, t.bn_down)
        self.const = dict(TOPK=self.k, TB=max(64, triton.next_power_of_2(T)), KP=triton.next_power_of_2(self.k),
                          EB=triton.next_power_of_2(E + 1), BM=t.bm, BK_=BK, DOT_F32=interpreting())
        self.h = torch.empty((P, I), dtype=torch.bfloat16, device=dev)     # per pair
        self.y = torch.empty((P, H), dtype=torch.float32, device=dev)      # per pair, weighted
        self.cnt = torch.empty((T * self.nt2 if t.fused_combine else 1,), dtype=torch.int32, device=dev)
        self.out = torch.empty((T, H), dtype=x.dtype, device=dev)

    def gate_up(self) -> None:
        ex, t = self.ex, self.tiles
        w, s, b = ex.gate_up, ex.gate_up_scale, ex.gate_up_bias
        _gate_up_kernel[(self.slots * self.nt1,)](
            self.x, self.ids, w, s, b, self.h, self.cnt,
            self.T, self.H, 2 * self.I, self.E, self.offset, self.nt1, self.cnt.numel() if t.fused_combine else 0,
            self.x.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), b.stride(0), self.h.stride(0),
            self.limit, SWIGLU_ALPHA, BN=t.bn_gate_up, KBP=_kblocks(self.H), num_warps=t.warps, num_stages=t.stages,
            **self.const)

    def down(self) -> None:
        ex, t = self.ex, self.tiles
        w, s, b = ex.down, ex.down_scale, ex.down_bias
        _down_kernel[(self.slots * self.nt2,)](
            self.h, self.ids, self.weights, w, s, b, self.y, self.out, self.cnt,
            self.T, self.I, self.H, self.E, self.offset, self.nt2,
            self.h.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), b.stride(0), self.y.stride(0),
            self.out.stride(0), BN=t.bn_down, KBP=_kblocks(self.I), FUSED=t.fused_combine, num_warps=t.warps,
            num_stages=t.stages, **self.const)

    def combine(self) -> None:
        if self.tiles.fused_combine:
            return
        bh = 1024
        _combine_kernel[(self.T, triton.cdiv(self.H, bh))](
            self.y, self.ids, self.out, self.H, self.offset, self.E, self.y.stride(0), self.out.stride(0),
            TOPK=self.k, BH=bh, num_warps=4)

    STAGES = ("gate_up", "down", "combine")

    def __call__(self) -> torch.Tensor:
        if self.T:
            self.gate_up()
            self.down()
            self.combine()
        return self.out


def moe_small(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
              limit: float, tiles: SmallTiles | None = None) -> torch.Tensor:
    """x [T, H] bf16, weights/ids [T, k], fp8 experts -> [T, H] in x.dtype (decode-sized T)."""
    return MoeSmall(x, weights, ids, experts, limit, tiles)()
