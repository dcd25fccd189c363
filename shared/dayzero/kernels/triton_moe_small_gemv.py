"""CUDA-core GEMV kernels of the decode MoE for one token (T = 1; gate_up also for a few tokens), launched
by ``MoeSplit`` when its tiles ask for them (``SplitTiles.gemv``).

At T = 1 each of the k routes is its own expert with one row, so the tensor-core path of
``triton_moe_small_split_kernels`` multiplies a 16-row A tile of which 15 rows are masked, and
spends ~180 instructions per warp and KB of weights widening FP8 into MMA fragments (sm_90 build).
Here every weight is used once, by FMA in fp32: program = (route j, N tile of BN rows); each K step
loads a [BN, BK] FP8 tile straight into registers (16 contiguous bytes per thread), ``U`` steps
issued back to back, and accumulates w * (x * block scale) per element; one row sum at the end.
  * ``gemv_gate_up_kernel``: h[j, tile's I columns] = clamped SwiGLU of bf16(x W1[e_j]^T + b1)
    (gate even, up odd rows), h fp16 or bf16 as the split path stores it. With ``P`` > 0 (T > 1, tiles
    with ``gemv_max_t``) j runs over the P pairs (token j // k): an expert routed to by several tokens
    is read once per pair, its tiles adjacent in the grid so the repeats come from L2.
  * ``gemv_down_kernel``: y[j, rows] = (h[j] W2[e_j]^T + b2) * routing weight (fp32); a ticket per N
    tile counts the local routes, the last program sums y over them in route order and writes out
    (no route to this rank: zeros) - the split path's fused combine (``_combine_tile``).
Routes to experts outside [offset, offset + E) are skipped. No host syncs: CUDA-graph capturable;
fixed summation order: bitwise repeatable.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_moe_small_pdl import trigger, wait
from .triton_moe_small_route import _touched
from .triton_moe_small_split_kernels import _combine_tile, _ticket
from .triton_swiglu import clamped_swiglu


@triton.jit
def _row_dot(w_ptrs, v_ptr, s_ptr, K, BN: tl.constexpr, BK: tl.constexpr, U: tl.constexpr,
             EVEN_K: tl.constexpr, PIPE: tl.constexpr = 0, G: tl.constexpr = 0):
    """[BN] fp32 = sum over k of w[n, k] * v[k] * scale[k // 128] (w: FP8 rows at ``w_ptrs`` + k,
    the [BN, BK] pointers of K step 0; BK divides 128). ``PIPE`` = 0: the loads of a loop trip are
    issued next to their use (sm_90 SASS: one DRAM round trip waited per trip, U steps in flight);
    ``PIPE`` > 0: the loop is software-pipelined over PIPE stages (``tl.range(num_stages=...)``: the
    compiler turns the weight, x and scale loads into cp.async copies into shared memory, PIPE - 1
    trips in flight; none of them depends on a load in the loop; run 11: slower, the GEMV is bound by
    its instructions and cp.async adds some). ``G`` > 0: each step first sums groups of G neighbouring
    products (w * x, a thread's own 16-byte run at G = 16), then scales those sums: acc [BN, BK / G]
    instead of [BN, BK] and no x * scale per element (run 11: 154 -> 140 instructions per warp and KB,
    gate_up 25.4 -> 22.8 us at T = 1)."""
    offs_k = tl.arange(0, BK)
    acc = tl.zeros((BN, BK // G if G > 0 else BK), dtype=tl.float32)
    for k0 in tl.range(0, K, BK * U, num_stages=PIPE if PIPE > 0 else None):
        for u in tl.static_range(U):
            k = k0 + u * BK
            if EVEN_K:
                w = tl.load(w_ptrs + k)
                v = tl.load(v_ptr + k + offs_k)
                sc = tl.load(s_ptr + k // 128)
            else:
                k_ok = k + offs_k < K
                w = tl.load(w_ptrs + k, mask=k_ok[None, :], other=0.0)
                v = tl.load(v_ptr + k + offs_k, mask=k_ok, other=0.0)
                sc = tl.load(s_ptr + k // 128, mask=k < K, other=0.0)
            if G > 0:
                prod = tl.reshape(w.to(tl.float32), (BN, BK // G, G)) * \
                    tl.reshape(v.to(tl.float32), (BK // G, G))[None, :, :]
                acc += tl.sum(prod, 2) * sc
            else:
                acc += w.to(tl.float32) * (v.to(tl.float32) * sc)[None, :]
    return tl.sum(acc, 1)


@triton.jit
def _expert_of(ids_ptr, j, offset, E):
    """Local expert of route j of token 0, -1 when another rank owns it."""
    e = tl.load(ids_ptr + j).to(tl.int32) - offset
    return tl.where((e >= 0) & (e < E), e, -1)


@triton.jit
def gemv_gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, h_ptr, K, N, n_tiles, offset, E, stride_we, stride_wn,
                        stride_se, stride_sn, stride_be, stride_h, limit, alpha,
                        BN: tl.constexpr, BK: tl.constexpr, U: tl.constexpr, EVEN_K: tl.constexpr,
                        PIPE: tl.constexpr = 0, G: tl.constexpr = 0, PDL: tl.constexpr = False,
                        P: tl.constexpr = 0, TOPK: tl.constexpr = 1, stride_x=0):
    trigger(PDL)   # the down grid (launch_pdl) may start; it waits for this grid before reading h
    pid = tl.program_id(0)
    if P > 0:   # T > 1: program = (N tile, pair j), pairs of one tile adjacent (a repeated expert's tile
        j = pid % P      # is read again while still in L2); x row = token of pair j
        tile = pid // P
        x_ptr += (j // TOPK).to(tl.int64) * stride_x
    else:       # T = 1: program = (route j, N tile)
        j = pid // n_tiles
        tile = pid % n_tiles
    e = _expert_of(ids_ptr, j, offset, E)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    rows = tile * BN + tl.arange(0, BN)
    rows_c = tl.where(rows < N, rows, 0)
    w_ptrs = w_ptr + e64 * stride_we + rows_c[:, None].to(tl.int64) * stride_wn + tl.arange(0, BK)[None, :]
    s_row = s_ptr + e64 * stride_se + ((tile * BN) // 128) * stride_sn
    v = _row_dot(w_ptrs, x_ptr, s_row, K, BN, BK, U, EVEN_K, PIPE, G)
    v = (v + tl.load(b_ptr + e64 * stride_be + rows_c).to(tl.float32)).to(tl.bfloat16).to(tl.float32)
    gate, up = tl.split(tl.reshape(v, (BN // 2, 2)))
    h = clamped_swiglu(gate, up, limit, alpha)
    cols = tile * (BN // 2) + tl.arange(0, BN // 2)
    tl.store(h_ptr + j * stride_h + cols, h.to(h_ptr.dtype.element_ty), mask=cols < N // 2)


@triton.jit
def gemv_down_kernel(h_ptr, ids_ptr, wt_ptr, w_ptr, s_ptr, b_ptr, y_ptr, out_ptr, ticket_ptr, K, N, n_tiles, P,
                     offset, E, stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_o,
                     TOPK: tl.constexpr, PB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, U: tl.constexpr,
                     EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, PIPE: tl.constexpr = 0,
                     G: tl.constexpr = 0, PDL: tl.constexpr = False):
    pid = tl.program_id(0)
    j = pid // n_tiles
    tile = pid % n_tiles
    rows = tile * BN + tl.arange(0, BN)
    n_ok = rows < N
    touched = _touched(ids_ptr, ids_ptr, 0, P, offset, E, PB, False)   # local routes (distinct experts)
    if touched == 0:  # no route to this rank: nobody draws a ticket, one program per tile writes zeros
        if j == 0:
            wait(PDL)
            _combine_tile(y_ptr, ids_ptr, out_ptr, 1, P, N, offset, E, stride_o, rows, n_ok, TOPK, 1, BN)
        return
    e = _expert_of(ids_ptr, j, offset, E)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    rows_c = tl.where(n_ok, rows, 0)
    w_ptrs = w_ptr + e64 * stride_we + rows_c[:, None].to(tl.int64) * stride_wn + tl.arange(0, BK)[None, :]
    s_row = s_ptr + e64 * stride_se + ((tile * BN) // 128) * stride_sn
    wait(PDL)   # gate_up complete (h visible) before the first h load or global store
    acc = _row_dot(w_ptrs, h_ptr + j * stride_h, s_row, K, BN, BK, U, EVEN_K, PIPE, G)
    y = (acc + tl.load(b_ptr + e64 * stride_be + rows_c).to(tl.float32)) * tl.load(wt_ptr + j).to(tl.float32)
    tl.store(y_ptr + j * N + rows, y, mask=n_ok)
    if _ticket(ticket_ptr + tile, rows, DOT_F32) == touched - 1:
        _combine_tile(y_ptr, ids_ptr, out_ptr, 1, P, N, offset, E, stride_o, rows, n_ok, TOPK, 1, BN)
        tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed")
