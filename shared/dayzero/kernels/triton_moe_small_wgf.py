"""The decode MoE's gate_up and down in one launch (``SplitTiles.wg_fused``): the ``triton_moe_small_wg`` tiles
as work items of one cooperative grid.

Why: the session-10 trace of the two-launch T = 1 layer (bench/NOTES.md "Session 10") shows every program of
both grids in one wave (<= 3 per SM), gate_up 19.3 us, then 1.2 us of kernel boundary before down's programs
start, down 12.1 us, and another ~1.8 us between calls: the boundary and the launch are ~9 % of the call.
Here each program first runs gate_up items (``i`` = tile * P + pair, as the wg grid's program ids), then down
items (``d`` = (tile * SPLIT... ) as the wg down grid's ids), strided by the grid size G:
  * a gate_up item ends by counting itself into its (pair, down K split) counter (``dep``; after its h stores
    are made visible GPU-wide: ``_ticket``);
  * a down item waits until its (pair, K split) counter holds every gate_up tile of that h range, then runs
    the wg down tile (partial, ticket, combine by the last arrival) and counts itself in too; the last of the
    N tiles to do so resets the counter to 0 for the next call.
No item waits before every gate_up item is done or being done by a resident program, so the grid must be
resident at once: G <= the programs that fit on the GPU (``coresident``), launched cooperatively (CUDA refuses
a grid that does not fit instead of letting it hang). The CPU interpreter runs one program (G = 1): every
gate_up item, then every down item, no wait taken.
Numerics, summation order and outputs are the wg tiles' (bitwise: the same item code).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_moe_small_split_kernels import _combine_tile, _ticket
from .triton_moe_small_wg import (_expert_tiles, _h_scale, _hq, _local, _local_pairs, _row_dot8, _stamp, _store_hq,
                                  _tma, _weights, check_tiles)
from .triton_swiglu import clamped_swiglu


@triton.jit
def _gate_up_item(i, x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, h_ptr, dep_ptr, K, N, P, offset, E, per, stride_x,
                  stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_h, limit, alpha, hs,
                  TOPK: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, X2: tl.constexpr,
                  KP: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, TMA: tl.constexpr,
                  SPLIT: tl.constexpr, trace_ptr, TRACE: tl.constexpr, RS: tl.constexpr):
    """gate_up tile i (= tile * P + pair j) of ``wg_gate_up_kernel`` with h as e4m3 hi / lo rows, then +1 on the
    counter of (j, the down K split holding these h columns: per columns each)."""
    _stamp(trace_ptr, i, 0, TRACE)
    _stamp(trace_ptr, i, 2, TRACE)
    j = i % P
    tile = i // P
    e = _local(ids_ptr, j, offset, E)
    if e >= 0:
        e64 = e.to(tl.int64)
        rows = tile * BN + tl.arange(0, BN)
        rows_c = tl.where(rows < N, rows, 0)
        w_src, s_row = _expert_tiles(w_ptr, s_ptr, e64, rows_c, tile, stride_we, stride_wn, stride_se, stride_sn,
                                     BN, BK, TMA)
        x_row = x_ptr + (j // TOPK).to(tl.int64) * stride_x
        v = _row_dot8(w_src, e, tile * BN, x_row, s_row, 0, K, K, hs, BN, BK, BT, KP, X2, EVEN_K, DOT_F32, False,
                      TMA, RS)
        v = (v + tl.load(b_ptr + e64 * stride_be + rows_c).to(tl.float32)).to(tl.bfloat16).to(tl.float32)
        gate, up = tl.split(tl.reshape(v, (BN // 2, 2)))
        h = clamped_swiglu(gate, up, limit, alpha)
        cols = tile * (BN // 2) + tl.arange(0, BN // 2)
        _store_hq(h, h_ptr + j * stride_h, cols, cols < N // 2, N // 2, hs)
        _stamp(trace_ptr, i, 1, TRACE)   # (before the count: a down item's wait stamp is after it)
        _ticket(dep_ptr + j * SPLIT + (tile * (BN // 2)) // per, cols, DOT_F32)


@triton.jit
def _wait_count(dep_ptr, target):
    """Spin until the counter at dep_ptr reaches target (acquire: the counted items' stores are visible after)."""
    while tl.atomic_add(dep_ptr, 0, sem="acquire") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _prefetch_l2(w_raw, e64, rows_c, k_lo, k_hi, stride_we, stride_wn, BN: tl.constexpr, PF: tl.constexpr,
                 LAST: tl.constexpr = False):
    """prefetch.global.L2 (``LAST``: ::evict_last) of the first PF 128-byte K blocks of the tile's BN weight rows."""
    q = tl.arange(0, PF)
    k = k_lo + q * 128
    ptrs = w_raw + e64 * stride_we + rows_c[:, None].to(tl.int64) * stride_wn + k[None, :]
    ok = (k < k_hi)[None, :] & (rows_c >= 0)[:, None]
    if LAST:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; "
                                  "mov.u32 $0, 0; }", "=r,l,r", [ptrs, ok.to(tl.int32)], dtype=tl.int32,
                                  is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; "
                                  "mov.u32 $0, 0; }", "=r,l,r", [ptrs, ok.to(tl.int32)], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _prefetch_down(d, ids_ptr, w_raw, K, N, n_tiles, P, offset, E, per, stride_we, stride_wn, BN: tl.constexpr,
                   SPLIT: tl.constexpr, PF: tl.constexpr):
    """The program's first down item's weights (evict_last) into L2 before its gate_up items (``PF_EARLY``)."""
    sp = d % SPLIT
    tile = (d // SPLIT) % n_tiles
    e = _local(ids_ptr, d // (SPLIT * n_tiles), offset, E)
    if e >= 0:
        rows = tile * BN + tl.arange(0, BN)
        k_lo = sp * per
        _prefetch_l2(w_raw, e.to(tl.int64), tl.where(rows < N, rows, 0), k_lo, tl.minimum(k_lo + per, K), stride_we,
                     stride_wn, BN, PF, True)


@triton.jit
def _down_item(d, h_ptr, ids_ptr, wt_ptr, w_ptr, w_raw, s_ptr, b_ptr, y_ptr, out_ptr, ticket_ptr, dep_ptr, K, N,
               n_tiles, T, P, offset, E, per, stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_be,
               stride_o, hs, TOPK: tl.constexpr, PB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               BT: tl.constexpr, KP: tl.constexpr, X2: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
               DOT_F32: tl.constexpr, TMA: tl.constexpr, HB: tl.constexpr, PF: tl.constexpr,
               PF_EARLY: tl.constexpr, trace_ptr, TRACE: tl.constexpr, RS: tl.constexpr):
    """down tile d of ``wg_down_kernel`` (sp = d % SPLIT, N tile, pair j), once gate_up's items of its h range
    [sp * per, + per) (HB columns each) are counted; then it counts itself, and the last of the n_tiles resets.
    PF > 0: first an L2 prefetch of the tile's first PF weight K blocks (they do not depend on h)."""
    _stamp(trace_ptr, d, 0, TRACE)
    _stamp(trace_ptr, d, 2, TRACE)
    sp = d % SPLIT
    tile = (d // SPLIT) % n_tiles
    j = d // (SPLIT * n_tiles)
    rows = tile * BN + tl.arange(0, BN)
    n_ok = rows < N
    local = _local_pairs(ids_ptr, P, offset, E, PB)
    if local == 0:
        if (j == 0) & (sp == 0):
            _combine_tile(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, rows, n_ok, TOPK, SPLIT, BN)
    else:
        e = _local(ids_ptr, j, offset, E)
        if e >= 0:
            k_lo = sp * per
            k_hi = tl.minimum(k_lo + per, K)
            dep = dep_ptr + j * SPLIT + sp
            need = tl.maximum(tl.cdiv(k_hi, HB) - k_lo // HB, 0)
            e64 = e.to(tl.int64)
            rows_c = tl.where(n_ok, rows, 0)
            if (PF > 0) & (not PF_EARLY):
                if not DOT_F32:   # (inline asm: not in the interpreter)
                    _prefetch_l2(w_raw, e64, rows_c, k_lo, k_hi, stride_we, stride_wn, BN, PF)
            if not DOT_F32:   # (the interpreter's single program has run every gate_up item already)
                _wait_count(dep, need)
            _stamp(trace_ptr, d, 3, TRACE)
            seen = tl.atomic_add(dep, 1, sem="relaxed")
            w_src, s_row = _expert_tiles(w_ptr, s_ptr, e64, rows_c, tile, stride_we, stride_wn, stride_se,
                                         stride_sn, BN, BK, TMA)
            acc = _row_dot8(w_src, e, tile * BN, h_ptr + j * stride_h, s_row, k_lo, k_hi, K, hs, BN, BK, BT, KP, X2,
                            EVEN_K, DOT_F32, True, TMA, RS)
            if sp == 0:
                acc += tl.load(b_ptr + e64 * stride_be + rows_c).to(tl.float32)
            y = acc * tl.load(wt_ptr + j).to(tl.float32)
            tl.store(y_ptr + (sp * P + j) * N + rows, y, mask=n_ok)
            if _ticket(ticket_ptr + tile, rows, DOT_F32) == local * SPLIT - 1:
                _combine_tile(y_ptr, ids_ptr, out_ptr, T, P, N, offset, E, stride_o, rows, n_ok, TOPK, SPLIT, BN)
                tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed")
            if seen == need + n_tiles - 1:   # every N tile of (j, sp) is past its wait
                tl.atomic_xchg(dep, 0, sem="relaxed")
            _stamp(trace_ptr, d, 1, TRACE)


@triton.jit
def wgf_kernel(x_ptr, ids_ptr, w1_ptr, s1_ptr, b1_ptr, h_ptr, wt_ptr, w2_ptr, w2_raw, s2_ptr, b2_ptr, y_ptr, out_ptr,
               ticket_ptr, dep_ptr, H, I, n_gu, n_dn, n_tiles2, T, P, offset, E, per, stride_x, stride_w1e,
               stride_w1n, stride_s1e, stride_s1n, stride_b1e, stride_h, stride_w2e, stride_w2n, stride_s2e,
               stride_s2n, stride_b2e, stride_o, limit, alpha, hs,
               TOPK: tl.constexpr, PB: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr, BK: tl.constexpr,
               BT: tl.constexpr, X2: tl.constexpr, KP1: tl.constexpr, KP2: tl.constexpr, SPLIT: tl.constexpr,
               EVEN_K1: tl.constexpr, EVEN_K2: tl.constexpr, DOT_F32: tl.constexpr, TMA1: tl.constexpr,
               TMA2: tl.constexpr, PF: tl.constexpr = 0, PF_EARLY: tl.constexpr = False, trace_gu=None, trace_dn=None,
               TRACE: tl.constexpr = False, RS: tl.constexpr = False):
    """Program p of G: gate_up items p, p + G, ... < n_gu, then down items p, p + G, ... < n_dn. ``TRACE``
    (diagnostic, ``bench/moe/wg_trace.py``): per item [start, end, SM, (down) wait returned] in trace_gu / trace_dn."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    if PF_EARLY:   # PF > 0: the first down item's weights head for L2 while the gate_up items stream theirs
        if (pid < n_dn) & (not DOT_F32):
            _prefetch_down(pid, ids_ptr, w2_raw, I, H, n_tiles2, P, offset, E, per, stride_w2e, stride_w2n, BN2,
                           SPLIT, PF)
    for i in range(pid, n_gu, G):
        _gate_up_item(i, x_ptr, ids_ptr, w1_ptr, s1_ptr, b1_ptr, h_ptr, dep_ptr, H, 2 * I, P, offset, E, per,
                      stride_x, stride_w1e, stride_w1n, stride_s1e, stride_s1n, stride_b1e, stride_h, limit, alpha,
                      hs, TOPK, BN1, BK, BT, X2, KP1, EVEN_K1, DOT_F32, TMA1, SPLIT, trace_gu, TRACE, RS)
    for d in range(pid, n_dn, G):
        _down_item(d, h_ptr, ids_ptr, wt_ptr, w2_ptr, w2_raw, s2_ptr, b2_ptr, y_ptr, out_ptr, ticket_ptr, dep_ptr, I,
                   H, n_tiles2, T, P, offset, E, per, stride_h, stride_w2e, stride_w2n, stride_s2e, stride_s2n,
                   stride_b2e, stride_o, hs, TOPK, PB, BN2, BK, BT, KP2, X2, SPLIT, EVEN_K2, DOT_F32, TMA2, BN1 // 2,
                   PF, PF_EARLY, trace_dn, TRACE, RS)


def coresident(kernel, device: torch.device) -> int:
    """Programs of a compiled kernel that fit on the GPU at once (registers, shared memory, warps, 32 a SM;
    sm_90's per-SM sizes where torch does not report them)."""
    kernel._init_handles()   # loads the module: n_regs
    props = torch.cuda.get_device_properties(device)
    warps = kernel.metadata.num_warps
    regs_warp = -(-max(kernel.n_regs, 1) * 32 // 256) * 256   # allocated per warp in units of 256
    by_regs = (getattr(props, "regs_per_multiprocessor", 65536) // regs_warp) // warps
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    by_smem = smem // (kernel.metadata.shared + 1024)          # + 1 KB reserved a block
    by_warps = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
    return props.multi_processor_count * max(0, min(by_regs, by_smem, by_warps, 32))


def check_fused(run) -> None:
    t = run.tiles
    check_tiles(t)
    if not t.wg_hq or t.wg_slots or t.pdl:
        raise ValueError("wg_fused tiles need wg_hq, and neither wg_slots nor pdl")


def launch(run, alpha: float, dot_f32: bool) -> None:
    """gate_up + down + combine of a ``MoeSplit`` (``run``) in one cooperative launch of ``wgf_kernel``."""
    ex, t = run.ex, run.tiles
    check_fused(run)
    w1, s1, b1, w2, s2, b2 = ex.gate_up, ex.gate_up_scale, ex.gate_up_bias, ex.down, ex.down_scale, ex.down_bias
    h = _hq(run)
    n_gu, n_dn = run.P * run.nt1, run.P * run.nt2 * run.s2
    per = triton.cdiv(triton.cdiv(run.I, 128), run.s2) * 128   # h columns of a down K split (wg_down_kernel's)
    args = (run.x, run.ids, _weights(w1, t.bn_gate_up, _tma(run, w1)), s1, b1, h, run.weights,
            _weights(w2, t.bn_down, _tma(run, w2)), w2, s2, b2, run.y, run.out, run.tickets2, run.deps, run.H, run.I,
            n_gu, n_dn, run.nt2, run.T, run.P, run.offset, run.E, per, run.x.stride(0), w1.stride(0), w1.stride(1),
            s1.stride(0), s1.stride(1), b1.stride(0), h.stride(0), w2.stride(0), w2.stride(1), s2.stride(0),
            s2.stride(1), b2.stride(0), run.out.stride(0), run.limit, alpha, _h_scale(run))
    meta = dict(TOPK=run.k, PB=run.pb, BN1=t.bn_gate_up, BN2=t.bn_down, BK=128, BT=16, X2=t.wg,
                KP1=triton.next_power_of_2(run.H), KP2=triton.next_power_of_2(run.I), SPLIT=run.s2,
                EVEN_K1=run.H % 128 == 0, EVEN_K2=run.I % 128 == 0, DOT_F32=dot_f32, TMA1=_tma(run, w1),
                TMA2=_tma(run, w2), PF=t.wg_prefetch, PF_EARLY=t.wg_prefetch_early, RS=t.wg_row_scales, num_warps=t.warps, num_stages=t.wg_stages)
    if run.trace is not None:   # (gate_up items, down items) int64 [items, 4]
        meta.update(trace_gu=run.trace[0], trace_dn=run.trace[1], TRACE=True)
    if dot_f32:   # the interpreter: one program, items in order, no waits
        wgf_kernel[(1,)](*args, **meta)
        return
    key = f"wgf_grid_{hash(t)}_{run.P}_{run.x.device}_{run.trace is not None}"   # kept with the weights: MoeSplit is built per call
    grid = ex.derived.get(key)
    if grid is None:
        kernel = wgf_kernel.warmup(*args, grid=(1,), launch_cooperative_grid=True, **meta)
        grid = ex.derived[key] = min(max(n_gu, n_dn), coresident(kernel, run.x.device))
        if grid < 1:
            raise RuntimeError("wg_fused: the kernel does not fit on an SM")
    wgf_kernel[(grid,)](*args, launch_cooperative_grid=True, **meta)
