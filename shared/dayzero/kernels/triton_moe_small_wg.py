"""FP8 tensor-core kernels of the decode MoE for a few tokens ("swap AB"), launched by ``MoeSplit`` when its
tiles ask for them (``SplitTiles.wg`` > 0, T <= ``gemv_max_t``). Opt-in candidates (session 6, CPU only).

Why: at T = 1-2 the CUDA-core GEMV (``triton_moe_small_gemv``) spends ~140 instructions per warp and KB of
FP8 weights (every byte loaded into registers, widened and FMA'd) and the fp16 MMA tiles ~90-190 (FP8 ->
fp16 fragments), so gate_up is issue-bound (run 11: 22.9 us for 66 MB). Here the weights never pass through
registers: program = (N tile of BN weight rows, pair j[, K split]); each 128-wide K step copies the FP8
tile [BN, 128] into shared memory (the pipeliner's cp.async ring, ``num_stages``; ``TMA``: one bulk copy per
tile) and feeds it as the A operand (M = BN rows, 64 per warpgroup) of an FP8 x FP8 dot (QGMMA e4m3 on sm_90).
The token is the B operand [128, BT = 16]: column 0 = hi = e4m3(x * ws / s), with ``X2`` = 2 column 8 = lo =
e4m3((x * ws / s - hi) * 16) (the residual: ~8 bits of x, close to bf16); the other columns zero: the padding
costs no weight bytes (it is on the token side; the tensor cores are idle anyway). s = max |x| * max ws / 448
(one pass over the row first); folding the step's block scale ws into the token lets the dots accumulate in
place. ``HQ`` (down): gate_up wrote h as e4m3 hi / lo rows of a fixed scale (|h| <= (limit + 1) * limit), so
down loads its B tile as a dot operand (no token work per step). sm_90 builds: 30-64 instructions per warp
and KB of weights in the K loops (bench/NOTES.md "MoE decode run 12").
  * ``wg_gate_up_kernel``: h[j, tile's I columns] = clamped SwiGLU of bf16(x_t W1[e_j]^T + b1) (gate
    even, up odd rows), t = j // TOPK; program id = tile * P + j (an expert's repeats adjacent: L2).
  * ``wg_down_kernel``: y[sp, j, rows] = partial (h[j] W2[e_j]^T [+ b2]) * routing weight over K split
    sp; a ticket per N tile counts local pairs x SPLIT arrivals, the last sums each token's routes in
    route order, then splits (``_combine_tile``), writes out [T, H] (no local pair: zeros) and resets it.
Routes to experts outside [offset, offset + E) are skipped. No host syncs (CUDA-graph capturable), fixed
summation order (bitwise repeatable). ``DOT_F32`` (the CPU interpreter): the dot in fp32 on the same
e4m3 values (exact products).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_moe_small_pdl import trigger, wait
from .triton_moe_small_split_kernels import _combine_tile, _ticket
from .triton_swiglu import clamped_swiglu

FP8_MAX = tl.constexpr(448.0)
# ``SplitTiles`` fields of the candidates (``triton_moe_small_split.VARIANTS`` adds the run-10 options
# row_scales / vec_combine / ids_once, which the k1_d64_r-like MMA tiles use above gemv_max_t): T = 1 (wg2:
# T <= 2) here; wgN_dM: gate_up / down tiles of N / M weight rows on 4 warps, _sS: down over S K ranges,
# _p6: 6 pipeline stages, _q: h handed over in e4m3 (below). sm_90 builds: 39-69 instructions per warp and KB of weights (GEMV gate_up: 140)
_WG = dict(split_gate_up=1, split_down=1, wg=2)
WG_VARIANTS = {
    "wg_d64": dict(bn_gate_up=64, bn_down=64, **_WG),
    "wg_d64_s2": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, **_WG),
    "wg_d64_s2_p6": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, wg_stages=6, **_WG),
    "wg128_d64_s2": dict(bn_gate_up=128, bn_down=64, wg_split_down=2, **_WG),
    "wg128_d128_s4": dict(bn_gate_up=128, bn_down=128, wg_split_down=4, **_WG),
    "wg2_d64_s2": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, gemv_max_t=2, **_WG),
    # _q: gate_up writes h as e4m3 hi + lo rows (wg_hq), down loads its B tile through the cp.async ring
    "wg_d64_s2_q": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, wg_hq=True, **_WG),
    "wg128_d128_s4_q": dict(bn_gate_up=128, bn_down=128, wg_split_down=4, wg_hq=True, **_WG),
    "wg2_d64_s2_q": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, gemv_max_t=2, wg_hq=True, **_WG),
    # _t: the weight tiles through TMA (one bulk copy per tile and step instead of 4-8 cp.async per thread)
    "wg_d64_s2_qt": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, wg_hq=True, wg_tma=True, **_WG),
    "wg128_d128_s4_qt": dict(bn_gate_up=128, bn_down=128, wg_split_down=4, wg_hq=True, wg_tma=True, **_WG),
    # session 8 (bench/NOTES.md "Session 8"): _p = the down grid launched with PDL (gate_up lets it start; down
    # waits before its first h load or store), and wg4 / wg8 = the wg kernels up to 4 / 8 tokens (one program per
    # pair and N tile: a weight tile shared by two pairs is read twice, the second time mostly from L2)
    "wg_d64_s2_qtp": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, wg_hq=True, wg_tma=True, pdl=True, **_WG),
    "wg128_d128_s4_qtp": dict(bn_gate_up=128, bn_down=128, wg_split_down=4, wg_hq=True, wg_tma=True, pdl=True,
                              **_WG),
    "wg2_d64_s2_p": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, gemv_max_t=2, pdl=True, **_WG),
    "wg2_d64_s2_qtp": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, gemv_max_t=2, wg_hq=True, wg_tma=True,
                           pdl=True, **_WG),
    "wg4_d64_s2_p": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, gemv_max_t=4, pdl=True, **_WG),
    "wg4_d64_s2_qtp": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, gemv_max_t=4, wg_hq=True, wg_tma=True,
                           pdl=True, **_WG),
    "wg8_d64_qtp": dict(bn_gate_up=64, bn_down=64, gemv_max_t=8, wg_hq=True, wg_tma=True, pdl=True, **_WG),
    # session 8, CPU only: T = 1's down (14.3 us for 33 MB, 54 % of 4.26 TB/s; unsplit 17.3, split 2 15.8 -> more
    # programs helped) over 3 / 4 K ranges: 540 / 720 programs
    "wg_d64_s3_qt": dict(bn_gate_up=64, bn_down=64, wg_split_down=3, wg_hq=True, wg_tma=True, **_WG),
    "wg_d64_s4_qt": dict(bn_gate_up=64, bn_down=64, wg_split_down=4, wg_hq=True, wg_tma=True, **_WG),
    # session 8, CPU only: wgsN = one program per expert slot carrying its <= 8 tokens (``triton_moe_small_wgs``)
    "wgs8_d64_qtp": dict(bn_gate_up=64, bn_down=64, gemv_max_t=8, wg_hq=True, wg_tma=True, pdl=True, wg_slots=True,
                         **_WG),
    "wgs8_d64_s2_qtp": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, gemv_max_t=8, wg_hq=True, wg_tma=True,
                            pdl=True, wg_slots=True, **_WG),
    "wgs8_d64_qt": dict(bn_gate_up=64, bn_down=64, gemv_max_t=8, wg_hq=True, wg_tma=True, wg_slots=True, **_WG),
    # session 10 (call 5, bench/NOTES.md "Session 10"): a shallower TMA ring fits more programs per SM: T = 2 at 3
    # stages (gate_up 27.7 KB, 8 per SM) 58.5 / 60.8 vs 61.8 / 63.9 us; T = 3-4 at 2 stages (19.5 KB, 11 per SM:
    # the 1440 gate_up programs in one wave) 90.5 / 112.7 vs 95.8 / 114.6
    "wg2_d64_s2_qtp_st3": dict(bn_gate_up=64, bn_down=64, wg_split_down=2, gemv_max_t=2, wg_hq=True, wg_tma=True,
                               pdl=True, wg_stages=3, **_WG),
    "wg8_d64_qtp_st2": dict(bn_gate_up=64, bn_down=64, gemv_max_t=8, wg_hq=True, wg_tma=True, pdl=True, wg_stages=2,
                            **_WG),
    # the same lever on the slot kernels of T = 5-8 (session 11, bench/NOTES.md "Session 11": lost at T = 8, 20B / 120B
    # 157.8 / 213.5 (st3), 165.4 / 217.9 (st2) vs wgs8_d64_qt 159.6 / 205.2 us; kept as bench entries)
    "wgs8_d64_qt_st3": dict(bn_gate_up=64, bn_down=64, gemv_max_t=8, wg_hq=True, wg_tma=True, wg_slots=True,
                            wg_stages=3, **_WG),
    "wgs8_d64_qt_st2": dict(bn_gate_up=64, bn_down=64, gemv_max_t=8, wg_hq=True, wg_tma=True, wg_slots=True,
                            wg_stages=2, **_WG),
}


@triton.jit
def _token_scale(x_row, K, KP: tl.constexpr):
    """One scale for the token's whole row: max |x| / 448 (e4m3 keeps ~2^-9 relative down to 2^-17 of it)."""
    offs = tl.arange(0, KP)
    a = tl.max(tl.abs(tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)), 0)
    return tl.maximum(a, 1e-30) / FP8_MAX


@triton.jit
def _token_load(x_row, k, K, BK: tl.constexpr):
    """x_row[k : k + BK] in fp32 (zeros past K)."""
    offs = k + tl.arange(0, BK)
    return tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)


@triton.jit
def _token_tile(v, inv, X2: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr):
    """v [BK] * inv -> B [BK, BT] e4m3: column 0 hi = e4m3(v * inv), with X2 = 2 column BT / 2 lo =
    e4m3((v * inv - hi) * 16) (the residual, |.| <= 16 * half an ulp of hi <= 256), the rest 0. Built
    from the 1-D values by joins with zeros (register moves; joins of e4m3 values do not build on sm_90:
    "illegal shared layout", so the joins are in fp16, converted once)."""
    v = v * inv
    hi = v.to(tl.float8e4nv).to(tl.float16)
    if X2 == 2:
        b = tl.join(hi, ((v - hi.to(tl.float32)) * 16.0).to(tl.float8e4nv).to(tl.float16))   # [BK, 2]: hi, lo
    else:
        b = tl.join(hi, tl.zeros_like(hi))
    tl.static_assert(BT == 16)
    b = tl.reshape(tl.join(b, tl.zeros_like(b)), (BK, 4))   # [BK, w] -> [BK, 2w]: the data in the even columns
    b = tl.reshape(tl.join(b, tl.zeros_like(b)), (BK, 8))
    return tl.reshape(tl.join(b, tl.zeros_like(b)), (BK, 16)).to(tl.float8e4nv)


@triton.jit
def _weight_tile(w_src, e, row0, k, K, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, TMA: tl.constexpr):
    """The weight tile [BN, BK] at K offset k (``_expert_tiles``' source; zeros past K)."""
    if TMA:
        w = tl.reshape(w_src.load([e, row0, k]), (BN, BK))
    elif EVEN_K:
        w = tl.load(w_src + k)
    else:
        w = tl.load(w_src + k, mask=(k + tl.arange(0, BK) < K)[None, :], other=0.0)
    return w


@triton.jit
def _acc_dot(acc, w, b, sc, DOT_F32: tl.constexpr, HQ: tl.constexpr):
    """acc + w @ b: scaled by the step's block scale sc when the token is already quantized (HQ), else sc is
    folded into the token and the wgmma accumulates in place; fp32 products in the interpreter."""
    if DOT_F32:
        d = tl.dot(w.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        acc += d * sc if HQ else d
    elif HQ:
        acc += tl.dot(w, b) * sc
    else:
        acc = tl.dot(w, b, acc)
    return acc


@triton.jit
def _row_dot8(w_src, e, row0, x_row, s_row, k_lo, k_hi, K, hs, BN: tl.constexpr, BK: tl.constexpr,
              BT: tl.constexpr, KP: tl.constexpr, X2: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
              HQ: tl.constexpr, TMA: tl.constexpr):
    """[BN] fp32 = sum over k in [k_lo, k_hi) of w[n, k] * x[k] (w: FP8 rows at ``w_src`` + k, the [BN, BK]
    pointers of k = 0, or with ``TMA`` a descriptor of the [E, N, K] weights read at [e, row0, k]: one bulk copy per
    tile, zeros past N and K; one block scale per step at ``s_row`` + k // 128; BK = 128; x: KP >= K). The weight
    tiles go through the pipeliner's cp.async ring; the token block and the block scale are loaded one
    step ahead into registers (not dot operands: the pipeliner leaves them next to their use).
    ``HQ``: x_row is already e4m3 [2, K] (hi, lo rows of scale hs, hs / 16: ``_store_hq``): B [BT, BK] is loaded
    as a dot operand (rows 0 and BT / 2, the others masked: no bytes), through the same cp.async ring, and each
    step's dot is scaled by its block scale. Else the block scale is folded into the token before it is
    quantized (x * ws / (s * max ws): the dots accumulate in place, no FMAs or wgmma wait per step)."""
    r = tl.arange(0, BT)
    if HQ:
        s = hs
    else:
        q = tl.arange(0, KP // BK)
        s = _token_scale(x_row, K, KP) * tl.max(tl.load(s_row + q, mask=q < tl.cdiv(K, BK), other=0.0), 0)
        v = _token_load(x_row, k_lo, K, BK)
    inv = 1.0 / s
    acc = tl.zeros((BN, BT), dtype=tl.float32)
    ws = tl.load(s_row + k_lo // BK, mask=k_lo < k_hi, other=0.0)
    for k in range(k_lo, k_hi, BK):
        w = _weight_tile(w_src, e, row0, k, K, BN, BK, EVEN_K, TMA)
        if HQ:
            offs = k + tl.arange(0, BK)
            b = tl.trans(tl.load(x_row + (r // (BT // 2))[:, None] * K + offs[None, :],
                                 mask=((r % (BT // 2)) == 0)[:, None] & (offs < K)[None, :], other=0.0))
        else:
            b = _token_tile(v * ws, inv, X2, BK, BT)
            v = _token_load(x_row, k + BK, K, BK)   # next step's (past K: zeros, no bytes)
        sc = ws
        ws = tl.load(s_row + (k + BK) // BK, mask=k + BK < k_hi, other=0.0)
        acc = _acc_dot(acc, w, b, sc, DOT_F32, HQ)
    return tl.sum(acc * tl.where(r == 0, s, tl.where(r == BT // 2, s / 16.0, 0.0))[None, :], 1)


@triton.jit
def _expert_tiles(w_ptr, s_ptr, e64, rows_c, tile, stride_we, stride_wn, stride_se, stride_sn, BN: tl.constexpr,
                  BK: tl.constexpr, TMA: tl.constexpr):
    """(weight source of expert e64's rows [tile * BN, + BN): the TMA descriptor itself, or the [BN, BK] pointers of
    k = 0 (rows_c: rows past N clamped to 0); the pointer to those rows' block scales)."""
    if TMA:
        w_src = w_ptr
    else:
        w_src = w_ptr + e64 * stride_we + rows_c[:, None].to(tl.int64) * stride_wn + tl.arange(0, BK)[None, :]
    return w_src, s_ptr + e64 * stride_se + ((tile * BN) // 128) * stride_sn


@triton.jit
def _store_hq(h, q_row, cols, n_ok, I, hs):
    """h [BN / 2] fp32 -> e4m3 hi = e4m3(h / hs) at q_row + cols, lo = e4m3((h / hs - hi) * 16) at q_row + I +
    cols. hs fixed: |h| <= (limit + 1) * limit (clamped SwiGLU), hs = that / 448, no per-row max needed."""
    t = h / hs
    hi = t.to(tl.float8e4nv)
    tl.store(q_row + cols, hi, mask=n_ok)
    tl.store(q_row + I + cols, ((t - hi.to(tl.float32)) * 16.0).to(tl.float8e4nv), mask=n_ok)


@triton.jit
def _stamp(trace_ptr, pid, slot: tl.constexpr, TRACE: tl.constexpr):
    """``TRACE`` (diagnostic, ``bench/moe/wg_trace.py``): trace [program, 4] int64 slot 0 start ns, 1 end ns,
    2 SM id, 3 (down) the PDL wait returned; ns from %globaltimer."""
    if TRACE:
        if slot == 2:
            v = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False,
                                          pack=1).to(tl.int64)
        else:
            v = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                          pack=1)
        tl.store(trace_ptr + pid.to(tl.int64) * 4 + slot, v)


@triton.jit
def _local(ids_ptr, j, offset, E):
    """Local expert of pair j, -1 when another rank owns it."""
    e = tl.load(ids_ptr + j).to(tl.int32) - offset
    return tl.where((e >= 0) & (e < E), e, -1)


@triton.jit
def _local_pairs(ids_ptr, P, offset, E, PB: tl.constexpr):
    """Number of pairs routed to a local expert."""
    q = tl.arange(0, PB)
    e = tl.load(ids_ptr + q, mask=q < P, other=-1).to(tl.int32) - offset
    return tl.sum(((q < P) & (e >= 0) & (e < E)).to(tl.int32), 0)


@triton.jit
def wg_gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, h_ptr, K, N, P, offset, E, stride_x, stride_we,
                      stride_wn, stride_se, stride_sn, stride_be, stride_h, limit, alpha, hs,
                      TOPK: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, X2: tl.constexpr,
                      KP: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, HQ: tl.constexpr,
                      TMA: tl.constexpr = False, PDL: tl.constexpr = False, trace_ptr=None,
                      TRACE: tl.constexpr = False):
    trigger(PDL)   # the down grid (launch_pdl) may start; it waits for this grid before reading h
    pid = tl.program_id(0)
    _stamp(trace_ptr, pid, 0, TRACE)
    _stamp(trace_ptr, pid, 2, TRACE)
    j = pid % P
    tile = pid // P
    e = _local(ids_ptr, j, offset, E)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    rows = tile * BN + tl.arange(0, BN)
    rows_c = tl.where(rows < N, rows, 0)
    w_src, s_row = _expert_tiles(w_ptr, s_ptr, e64, rows_c, tile, stride_we, stride_wn, stride_se, stride_sn, BN, BK,
                                 TMA)
    x_row = x_ptr + (j // TOPK).to(tl.int64) * stride_x
    v = _row_dot8(w_src, e, tile * BN, x_row, s_row, 0, K, K, hs, BN, BK, BT, KP, X2, EVEN_K, DOT_F32, False, TMA)
    v = (v + tl.load(b_ptr + e64 * stride_be + rows_c).to(tl.float32)).to(tl.bfloat16).to(tl.float32)
    gate, up = tl.split(tl.reshape(v, (BN // 2, 2)))
    h = clamped_swiglu(gate, up, limit, alpha)
    cols = tile * (BN // 2) + tl.arange(0, BN // 2)
    if HQ:   # h_ptr: the e4m3 view [P, 2 * I] of h (stride_h = 2I)
        _store_hq(h, h_ptr + j * stride_h, cols, cols < N // 2, N // 2, hs)
    else:
        tl.store(h_ptr + j * stride_h + cols, h.to(h_ptr.dtype.element_ty), mask=cols < N // 2)
    _stamp(trace_ptr, pid, 1, TRACE)


@triton.jit
def wg_down_kernel(h_ptr, ids_ptr, wt_ptr, w_ptr, s_ptr, b_ptr, y_ptr, out_ptr, ticket_ptr, K, N, n_tiles, T, P,
                   offset, E, stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_o, hs,
                   TOPK: tl.constexpr, PB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
                   KP: tl.constexpr, X2: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
                   HQ: tl.constexpr, TMA: tl.constexpr = False, PDL: tl.constexpr = False, trace_ptr=None,
                   TRACE: tl.constexpr = False):
    pid = tl.program_id(0)
    _stamp(trace_ptr, pid, 0, TRACE)
    _stamp(trace_ptr, pid, 2, TRACE)
    sp = pid % SPLIT
    tile = (pid // SPLIT) % n_tiles
    j = pid // (SPLIT * n_tiles)
    rows = tile * BN + tl.arange(0, BN)
    n_ok = rows < N
    local = _local_pairs(ids_ptr, P, offset, E, PB)   # (ids: written before gate_up started)
    wait(PDL)   # gate_up complete (h visible) before the first h load or any store
    _stamp(trace_ptr, pid, 3, TRACE)
    if local == 0:  # nothing routed to this rank: nobody draws a ticket, one program per tile writes zeros
        if (j == 0) & (sp == 0):
            _combine_tile(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, rows, n_ok, TOPK, SPLIT, BN)
        return
    e = _local(ids_ptr, j, offset, E)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    rows_c = tl.where(n_ok, rows, 0)
    w_src, s_row = _expert_tiles(w_ptr, s_ptr, e64, rows_c, tile, stride_we, stride_wn, stride_se, stride_sn, BN, BK,
                                 TMA)
    per = tl.cdiv(tl.cdiv(K, BK), SPLIT) * BK
    k_lo = sp * per
    acc = _row_dot8(w_src, e, tile * BN, h_ptr + j * stride_h, s_row, k_lo, tl.minimum(k_lo + per, K), K, hs, BN,
                    BK, BT, KP, X2, EVEN_K, DOT_F32, HQ, TMA)
    if sp == 0:
        acc += tl.load(b_ptr + e64 * stride_be + rows_c).to(tl.float32)
    y = acc * tl.load(wt_ptr + j).to(tl.float32)
    tl.store(y_ptr + (sp * P + j) * N + rows, y, mask=n_ok)
    if _ticket(ticket_ptr + tile, rows, DOT_F32) == local * SPLIT - 1:
        _combine_tile(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, rows, n_ok, TOPK, SPLIT, BN)
        tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed")
    _stamp(trace_ptr, pid, 1, TRACE)


def check_tiles(t) -> None:
    """The dot's M side is the weight tile: 64 or 128 rows (one or two m64 wgmma rows per warpgroup)."""
    if t.bn_gate_up not in (64, 128) or t.bn_down not in (64, 128) or t.wg not in (1, 2) or t.wg_split_down < 1:
        raise ValueError(f"wg tiles need bn_gate_up / bn_down in (64, 128), wg in (1, 2) and wg_split_down >= 1, "
                         f"got {t.bn_gate_up} / {t.bn_down}, {t.wg}, {t.wg_split_down}")


def _hq(run):
    """h as the kernels take it: with ``wg_hq`` the e4m3 view [P, 2I] of the fp16 buffer [P, I] (hi, lo rows)."""
    return run.h.view(torch.float8_e4m3fn) if run.tiles.wg_hq else run.h


def _tma(run, w: torch.Tensor) -> bool:
    """``wg_tma`` where TMA can read the weights: rows of a multiple of 16 bytes (else per-thread cp.async)."""
    return run.tiles.wg_tma and w.shape[-1] % 16 == 0 and w.is_contiguous()


def _weights(w: torch.Tensor, bn: int, tma: bool):
    """The weights as the kernels take them: the tensor, or (``wg_tma``) a TMA descriptor of [E, N, K] with
    [1, bn, 128] boxes (host-built: a kernel parameter, captured by value in CUDA graphs)."""
    if not tma:
        return w
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(w, [1, bn, 128])


def _h_scale(run) -> float:
    """hq's hi scale: |h| <= (limit + 1) * limit (clamped SwiGLU) maps onto e4m3's 448."""
    if run.tiles.wg_hq and not 0 < run.limit <= 16:
        raise ValueError(f"wg_hq needs a SwiGLU limit in (0, 16] (h bounded by (limit + 1) * limit), got {run.limit}")
    return (run.limit + 1.0) * run.limit / 448.0


def _trace(run, stage: int) -> dict:
    """The TRACE launch arguments of ``run.trace`` (None, or (gate_up, down) int64 [programs, 4] buffers set by a
    diagnostic: ``bench/moe/wg_trace.py``)."""
    return dict(trace_ptr=run.trace[stage], TRACE=True) if run.trace is not None else {}


def launch_gate_up(run, alpha: float, dot_f32: bool) -> None:
    """gate_up of a ``MoeSplit`` (``run``) on ``wg_gate_up_kernel``: P * ceil(2I / BN) programs."""
    ex, t = run.ex, run.tiles
    check_tiles(t)
    w, s, b = ex.gate_up, ex.gate_up_scale, ex.gate_up_bias
    h = _hq(run)
    wg_gate_up_kernel[(run.P * run.nt1,)](
        run.x, run.ids, _weights(w, t.bn_gate_up, _tma(run, w)), s, b, h, run.H, 2 * run.I, run.P, run.offset, run.E, run.x.stride(0), w.stride(0),
        w.stride(1), s.stride(0), s.stride(1), b.stride(0), h.stride(0), run.limit, alpha, _h_scale(run),
        TOPK=run.k, BN=t.bn_gate_up, BK=128, BT=16, KP=triton.next_power_of_2(run.H), X2=t.wg, EVEN_K=run.H % 128 == 0, DOT_F32=dot_f32,
        HQ=t.wg_hq, TMA=_tma(run, w), PDL=run.pdl, num_warps=t.warps, num_stages=t.wg_stages, **_trace(run, 0))


def launch_down(run, dot_f32: bool) -> None:
    """down + combine of a ``MoeSplit`` on ``wg_down_kernel``: P * ceil(H / BN) * s2 programs."""
    ex, t = run.ex, run.tiles
    w, s, b = ex.down, ex.down_scale, ex.down_bias
    h = _hq(run)
    wg_down_kernel[(run.P * run.nt2 * run.s2,)](
        h, run.ids, run.weights, _weights(w, t.bn_down, _tma(run, w)), s, b, run.y, run.out, run.tickets2, run.I, run.H, run.nt2, run.T, run.P,
        run.offset, run.E, h.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), b.stride(0),
        run.out.stride(0), _h_scale(run), TOPK=run.k, PB=run.pb, BN=t.bn_down, BK=128, BT=16, KP=triton.next_power_of_2(run.I), X2=t.wg, SPLIT=run.s2,
        EVEN_K=run.I % 128 == 0, DOT_F32=dot_f32, HQ=t.wg_hq, TMA=_tma(run, w), PDL=run.pdl,
        num_warps=t.warps_down or t.warps, num_stages=t.wg_stages, **run._pdl_launch(), **_trace(run, 1))
