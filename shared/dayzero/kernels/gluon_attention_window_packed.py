"""Sliding-window prefill, version 2 (Gluon, sm_90): GQA-packed rows, a persistent walk along the sequence
with a TMA producer warp. Written on the CPU in session 5, first run on an H200 in session 6 (correct in every
configuration; bench/NOTES.md "Gluon window on the GPU (session 6)"); the registered op's window-128 prefill
path (``triton_attention_prefill.gluon_window_choice``). ``gluon_attention_window.window_attention`` runs it
for the ``pk*`` configurations; same supported case as version 1 (window 1..128, head dim 64, bf16, no
cached prefix) and, here, a GQA group of 8 (two quads of 4 heads).

Why (NOTES): version 1 scores 3 tiles of 64 keys for 128 visible (1.5x waste in tensor core and exp work),
and every CTA loads its whole window before it computes (no overlap across work items, 2 CTAs per SM).

Layout (``gluon_attention_window_schedule.emulate_window_packed`` runs the same arithmetic in torch):
  * a unit = 16 consecutive tokens t0 .. t0 + 15 (t0 a multiple of 16) of one KV head; an item = a unit's
    4-head quad (items 2u, 2u + 1): 64 score rows, row r = head (r // 16) of the quad, token t0 + r % 16.
    Its keys: [t0 - 128, t0 + 16), 144 of them (ups 1), as two wgmma tiles because tensor shapes and shared-memory
    slices are powers of 2 at aligned offsets: keys t0 - 128 .. t0 - 1 (m64n128; masked below the window
    only) and t0 .. t0 + 15 (m64n16; masked above the row's token). One exp per score, no online rescaling
    (the sink joins the row max before the exps): 144 scored keys a row for 128 visible (1.125x);
  * a CTA = one KV head x a chunk of units of one sequence, walked in order (grid (KV heads, chunks,
    sequences), about one CTA per SM, ``packed_chunk``);
  * 1 producer warp: per ring slot of ``ups`` units (tokens t0 .. t0 + 16 ups), into slot v % stages (52 KB
    at ups 1, 72 KB at ups 2): K and V rows [t0 - 128, t0) and [t0, t0 + 16 ups) (boxes [128, 64] and
    [16 ups, 64]; below row 0 TMA zero fill, masked anyway) and the units' Q quads (one [16, 64] box a head).
    Every unit of a slot scores all 128 + 16 ups keys (ups 2: 160, 1.25x). Neighbouring slots' keys overlap:
    they are re-read from L2, as an aligned 128-key slice cannot start at t0 - 128 of a shared ring;
  * ``nc`` consumer warpgroups take the items round-robin (nc = 2: warpgroup g keeps quad g). ``serial``
    off: FA3-style, the PV of item i runs under the S wgmmas of the next (P carried as the bf16 A operand),
    then item i's O / l is stored; the first PV is a dummy (P = 0, store masked). ``serial`` on: S, softmax,
    PV, store in turn (3 warpgroups fit 160 registers only so); the tensor core and the exps then overlap
    across the warpgroups. ptxas places the wait for the PV above the exps in both builds (as in the
    prefill kernel without its ``pin``), so inside a warpgroup the overlap is the S / PV wgmmas only;
  * a slot is released (2 ups arrivals: its items) once each item's PV is done; keys before the sequence start
    (TMA zero fill below row 0, or the previous sequence) and after each row's token are masked: row r sees
    column c iff max(rt + 129 - w, 128 - t0) <= c <= rt + 128, rt = r % 16; rows past the sequence's end
    read the next sequence (or TMA zero fill) and are never stored;
  * session 6 options: ``direct_store`` (O / l stored from the wgmma layout: no 8 KB a warpgroup of
    layout-conversion scratch, so a 4th 52 KB slot fits), ``prefetch`` (the producer also issues an L2
    prefetch of slot v + prefetch's Q / K / V rows: the DRAM stream in flight without shared memory);
    ``tma_store`` / ``store_via_q`` (O out by TMA from a staging buffer / the item's Q box), ``q3d`` (rows (token,
    head): a quad's Q as one 3D box), ``kv_ring`` (K / V in a mirrored ring of 16-key groups, each loaded once:
    ``_pk_producer_ring``), ``diag`` (timed-only diagnostics). Session 6 round 2 measured the first two slower
    than pk3s; q3d and kv_ring are not yet timed (bench/NOTES.md).
Reused from the prefill kernel: ``_to_a``, ``WM``, ``HD``. Importing this module imports triton's
Gluon.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gluon_attention_prefill import HD, WM, _to_a
from .gluon_attention_schedule import LOG2E
from .gluon_attention_window_schedule import PK_HEADS, PK_TOK, packed_chunk, ring_waits_every_phase

TPU = gl.constexpr(PK_TOK)    # tokens per unit (16)
HPW = gl.constexpr(PK_HEADS)  # heads per unit / warpgroup (4)
KVG = gl.constexpr(16)        # kv_ring: 16-key groups in the K / V ring (+ 8 mirrored: any 8 in a row contiguous)


# the TMA boxes' shared layouts ([rows, 64] bf16, 128-byte swizzle), computed once: building them per call
# cost ~14 us of host time each (5 descriptors a call; session 6's first run: 88 us eager vs 63 us graph at 8k)
_BOX_LAYOUTS = {rows: gl.NVMMASharedLayout.get_default_for([rows, 64], gl.bfloat16) for rows in (16, 32, 128)}
_QUAD_LAYOUT = gl.NVMMASharedLayout.get_default_for([PK_TOK, PK_HEADS, 64], gl.bfloat16)   # the q3d boxes


def _box_desc(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """[T, H, 64] (rows 16-byte aligned) -> 2D descriptor over [T, H * 64] with [rows, 64] boxes."""
    T, H, D = t.shape
    return TensorDescriptor(t, [T, H * D], [t.stride(0), 1], [rows, D], _BOX_LAYOUTS[rows])


def _quad_desc(t: torch.Tensor) -> TensorDescriptor:
    """[T, H, 64] (heads contiguous) -> 3D descriptor with [16 tokens, 4 heads, 64] boxes (``q3d``)."""
    T, H, D = t.shape
    return TensorDescriptor(t, [T, H, D], [t.stride(0), t.stride(1), 1], [PK_TOK, PK_HEADS, D], _QUAD_LAYOUT)


@dataclass(frozen=True)
class GluonWindowPackedConfig:
    """Launch configuration of version 2: one CTA per SM (2 consumer warpgroups + 1 producer warp; registers
    ``maxnreg`` x 3 warpgroups, setmaxnreg moves the producer's surplus to the consumers)."""

    stages: int = 3           # ring slots: K 128 + 16 ups keys, V the same, the units' Q quads: 52 KB (ups 1)
    consumer_regs: int = 240
    producer_regs: int = 24
    maxnreg: int = 168
    min_units: int = 8        # units (16 tokens) a CTA walks at least (the host picks ~one CTA per SM above it)
    nc: int = 2               # consumer warpgroups: 2 (warpgroup g on heads 4 g ..) or 3 (items round-robin)
    serial: bool = False      # True: no PV in flight across items inside a warpgroup (``_pk_consumer_serial``)
    ups: int = 1              # units a ring slot: 1 (144 keys a row) or 2 (160 keys a row, half the K/V bytes)
    direct_store: bool = False  # O stored from the wgmma layout: no 8 KB a warpgroup of conversion scratch
    tma_store: bool = False   # serial only: O staged in a [64, 64] buffer a warpgroup, whole units leave by TMA
    store_via_q: bool = False  # serial only: the same through the item's own Q box (no staging: 4 slots fit)
    prefetch: int = 0         # > 0: the producer prefetches slot v + prefetch's Q / K / V rows into L2 (no smem)
    q3d: bool = False         # serial only: rows r -> token r // 4, head r % 4; a quad's Q as ONE 3D TMA box
    #                           [16, 4, 64] (4 x fewer Q loads), with store_via_q O out the same (store modes 0 / 3)
    kv_ring: bool = False     # serial, ups 1, store mode 0: K / V in a ring of 16-key groups, each loaded once (2 + 2
    #                           KB a unit instead of 36 KB), the 128-key window a contiguous view of a mirrored ring;
    #                           ``stages`` then counts Q slots only
    diag: int = 0             # serial only, diagnostics (wrong output; timed, never tested): 1 the consumers wait
    #                           for each slot and release it (the ring's fill rate alone), 2 no O store (the
    #                           store under a run-time condition that never holds: everything else runs)

    nwg = 2                   # head quads a unit (GQA group 8 = 2 x 4 heads)


@gluon.jit
def _pk_prefetch(pf, row0, row_end, h0, hkv, GROUP: gl.constexpr, UPS: gl.constexpr):
    """L2 prefetch (``cp.async.bulk.prefetch.L2``: no shared memory, no barrier) of the rows row0 .. row0 + 16 UPS
    - 1 of a later ring slot: per token its GROUP query heads (GROUP x 128 bytes, contiguous; lanes 0-15) and its
    K and V rows of the KV head (128 bytes each; lanes 16-31). Rows at or past row_end (the sequence's end) are
    skipped. The slot's TMA loads then read Q (the DRAM stream: 134 of 151 MB at 8k) from L2."""
    q_ptr, k_ptr, v_ptr, stride_qt, stride_kt, stride_vt = pf
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    lane = gl.arange(0, 32, lay)
    is_q = lane < 16
    for j in gl.static_range(UPS):
        tok = row0 + j * TPU + lane % 16
        ok = (tok < row_end).to(gl.int32)
        t64 = tok.to(gl.int64)
        a1 = gl.where(is_q, (q_ptr + t64 * stride_qt + h0 * HD).to(gl.int64, bitcast=True),
                      (k_ptr + t64 * stride_kt + hkv * HD).to(gl.int64, bitcast=True))
        n1 = gl.where(is_q, GROUP * HD * 2, HD * 2)
        a2 = (v_ptr + t64 * stride_vt + hkv * HD).to(gl.int64, bitcast=True)
        ok2 = ok * (1 - is_q.to(gl.int32))
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $1, 0; @p cp.async.bulk.prefetch.L2.global [$2], $3; "
            "setp.ne.b32 p, $4, 0; @p cp.async.bulk.prefetch.L2.global [$5], 128; mov.b32 $0, 0; }",
            "=r,r,l,r,r,l", [ok, a1, n1, ok2, a2], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pk_kv_group(kdd, vdd, kr, vr, kvb, row, hkv, lg):
    """kv_ring: K and V rows row .. row + 15 (local group lg) into ring slot lg % 16 on its barrier; slots 0-7 also
    into their mirrors 16-23, so the 8 groups of any unit's window are contiguous rows of the ring."""
    gs = lg % KVG
    mir = gs < 8
    bar = kvb.index(gs)
    mbarrier.expect(bar, 2 * TPU * HD * 2, pred=gs >= 8)
    mbarrier.expect(bar, 4 * TPU * HD * 2, pred=mir)
    tma.async_copy_global_to_shared(kdd, [row, hkv * HD], bar, kr.index(gs))
    tma.async_copy_global_to_shared(vdd, [row, hkv * HD], bar, vr.index(gs))
    tma.async_copy_global_to_shared(kdd, [row, hkv * HD], bar, kr.index(KVG + gs % 8), pred=mir)
    tma.async_copy_global_to_shared(vdd, [row, hkv * HD], bar, vr.index(KVG + gs % 8), pred=mir)


@gluon.jit
def _pk_producer(p, NWG: gl.constexpr, S: gl.constexpr, UPS: gl.constexpr, PF: gl.constexpr, pf,
                 GROUP: gl.constexpr, Q3: gl.constexpr = False, KVR: gl.constexpr = False, st=None):
    """1 warp: per ring slot of the walk (UPS units, tokens t0 .. t0 + 16 UPS), into slot v % S: K and V rows
    [t0 - 128, t0) and [t0, t0 + 16 UPS) of the KV head (below row 0: TMA zero fill; masked anyway), then each
    unit's Q quads (one [16, 64] box a head). PF > 0: first an L2 prefetch of slot v + PF's rows
    (``_pk_prefetch``; the first PF slots' rows at the start)."""
    (qd, kd, kdd, vd, vdd, q_smem, km, kdg, vm, vdg, ready, empty, o_ptr, sink_ptr, stride_ot, stride_oh, qk_scale,
     window, q_start, q_len, tok0, n_units, h0, hkv) = p
    if KVR:
        _pk_producer_ring(p, NWG, S, Q3, st[2])
        return
    n_slots = gl.cdiv(n_units, UPS)
    if PF > 0:
        for v in range(S, gl.minimum(PF, n_slots)):
            _pk_prefetch(pf, q_start + tok0 + v * (UPS * TPU), q_start + q_len, h0, hkv, GROUP, UPS)
    for v in range(n_slots):
        s = v % S
        if PF > 0:
            if v + PF < n_slots:
                _pk_prefetch(pf, q_start + tok0 + (v + PF) * (UPS * TPU), q_start + q_len, h0, hkv, GROUP, UPS)
        mbarrier.wait(empty.index(s), ((v // S) & 1) ^ 1)               # the first pass finds every slot free
        mbarrier.expect(ready.index(s), (2 * (128 + UPS * TPU) + UPS * NWG * WM) * HD * 2)
        t0 = q_start + tok0 + v * (UPS * TPU)
        tma.async_copy_global_to_shared(kd, [t0 - 128, hkv * HD], ready.index(s), km.index(s))
        tma.async_copy_global_to_shared(kdd, [t0, hkv * HD], ready.index(s), kdg.index(s))
        for j in gl.static_range(UPS):
            for g in gl.static_range(NWG):
                if Q3:                   # the quad in one 3D box: rows (token, head) in the [64, 64] buffer
                    tma.async_copy_global_to_shared(qd, [t0 + j * TPU, h0 + g * HPW, 0], ready.index(s),
                                                    q_smem.index((s * UPS + j) * NWG + g)._reinterpret(
                                                        gl.bfloat16, [TPU, HPW, HD], qd.layout))
                else:
                    for hh in gl.static_range(HPW):
                        tma.async_copy_global_to_shared(qd, [t0 + j * TPU, (h0 + g * HPW + hh) * HD],
                                                        ready.index(s),
                                                        q_smem.index((s * UPS + j) * NWG + g).slice(hh * TPU, TPU))
        tma.async_copy_global_to_shared(vd, [t0 - 128, hkv * HD], ready.index(s), vm.index(s))
        tma.async_copy_global_to_shared(vdd, [t0, hkv * HD], ready.index(s), vdg.index(s))


@gluon.jit
def _pk_producer_ring(p, NWG: gl.constexpr, S: gl.constexpr, Q3: gl.constexpr, kvb):
    """kv_ring's producer: first the local groups 0-7 (keys [t0 - 128, t0) of the CTA's first unit), then per unit v
    its Q quads into Q slot v % S (``ready`` / ``empty`` as before) and its own group v + 8 (keys t0 .. t0 + 15) into
    the ring. The ring slot's previous group (v + 8 - 16) was last read by unit v - 8, released before unit v - S's
    release (waited here, in order) as long as 16 >= 8 + S."""
    (qd, kd, kdd, vd, vdd, q_smem, km, kdg, vm, vdg, ready, empty, o_ptr, sink_ptr, stride_ot, stride_oh, qk_scale,
     window, q_start, q_len, tok0, n_units, h0, hkv) = p
    row0 = q_start + tok0 - 128                           # local group lg: key rows row0 + 16 lg ..
    for lg in range(8):
        _pk_kv_group(kdd, vdd, km, vm, kvb, row0 + lg * TPU, hkv, lg)
    for v in range(n_units):
        s = v % S
        mbarrier.wait(empty.index(s), ((v // S) & 1) ^ 1)               # the first pass finds every slot free
        mbarrier.expect(ready.index(s), NWG * WM * HD * 2)
        t0 = q_start + tok0 + v * TPU
        for g in gl.static_range(NWG):
            if Q3:
                tma.async_copy_global_to_shared(qd, [t0, h0 + g * HPW, 0], ready.index(s),
                                                q_smem.index(s * NWG + g)._reinterpret(gl.bfloat16, [TPU, HPW, HD],
                                                                                       qd.layout))
            else:
                for hh in gl.static_range(HPW):
                    tma.async_copy_global_to_shared(qd, [t0, (h0 + g * HPW + hh) * HD], ready.index(s),
                                                    q_smem.index(s * NWG + g).slice(hh * TPU, TPU))
        _pk_kv_group(kdd, vdd, km, vm, kvb, t0, hkv, v + 8)


@gluon.jit
def _pk_store(o, l_i, o_ptr, q_start, q_len, t0, hbase, stride_ot, stride_oh, DIRECT: gl.constexpr = False,
              Q3: gl.constexpr = False):
    """O / l [WM, HD] of an item: row r -> token t0 + r % 16, head hbase + r // 16; rows past the sequence's end
    (and the dummy item, t0 < 0) not stored. DIRECT: stored from the wgmma accumulator layout (4-byte stores,
    no shared-memory round trip: the ring gets the 8 KB a warpgroup the layout conversion needs); else
    converted to 16-byte rows first. Q3: row r is token t0 + r // 4, head hbase + r % 4."""
    inv = gl.convert_layout(1.0 / l_i, gl.SliceLayout(1, o.type.layout))
    if DIRECT:
        st: gl.constexpr = o.type.layout
        out = (o * gl.expand_dims(inv, 1)).to(o_ptr.dtype.element_ty)
    else:
        st: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])    # 16-byte stores, 8 threads a row
        out = gl.convert_layout((o * gl.expand_dims(inv, 1)).to(o_ptr.dtype.element_ty), st)
    r = gl.arange(0, WM, gl.SliceLayout(1, st))
    if Q3:
        tok = t0 + r // HPW
        head = hbase + r % HPW
    else:
        tok = t0 + r % TPU
        head = hbase + r // TPU
    col = gl.arange(0, HD, gl.SliceLayout(0, st))
    ptrs = o_ptr + gl.expand_dims((q_start + tok).to(gl.int64) * stride_ot + head * stride_oh, 1) \
        + gl.expand_dims(col, 0)
    gl.store(ptrs, out, mask=gl.expand_dims((tok < q_len) & (t0 >= 0), 1))


@gluon.jit
def _pk_store_tma(o, l_i, od, buf, o_ptr, q_start, q_len, t0, hbase, stride_ot, stride_oh,
                  WAIT_PREV: gl.constexpr = True, Q3: gl.constexpr = False):
    """O / l [WM, HD] of an item through the warpgroup's staging buffer ``buf`` [WM, HD] (the Q boxes' 128-byte
    swizzled layout): a whole unit (t0 + 16 <= q_len) leaves as 4 TMA stores of [16, 64] (one a head: rows
    16 hh .. are head hbase + hh, tokens t0 ..; asynchronous, whole 128-byte lines, no LSU stores); the
    sequence's last, partial unit is read back in 16-byte rows and stored masked (TMA would write the rows past
    the sequence, which belong to the next one). WAIT_PREV: the previous item's stores must have read ``buf``
    first (a staging buffer reused item after item; not when ``buf`` is the item's own Q box). Q3: rows (token,
    head) as the Q box's, the whole unit as one 3D box [16, 4, 64] (``od`` a 3D descriptor)."""
    inv = gl.convert_layout(1.0 / l_i, gl.SliceLayout(1, o.type.layout))
    val = (o * gl.expand_dims(inv, 1)).to(gl.bfloat16)
    if WAIT_PREV:
        tma.store_wait(0)                # (the issuing thread) the previous item's stores have read buf
        gl.thread_barrier()              # ... before any thread of the warpgroup overwrites it
    buf.store(val)
    fence_async_shared()
    gl.thread_barrier()                  # every thread's rows are in buf before the TMA stores read it
    if t0 + TPU <= q_len:
        if Q3:
            tma.async_copy_shared_to_global(od, [q_start + t0, hbase, 0],
                                            buf._reinterpret(gl.bfloat16, [TPU, HPW, HD], od.layout))
        else:
            for hh in gl.static_range(HPW):
                tma.async_copy_shared_to_global(od, [q_start + t0, (hbase + hh) * HD], buf.slice(hh * TPU, TPU))
    else:
        st: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])    # 16-byte stores, 8 threads a row
        out = buf.load(st)
        r = gl.arange(0, WM, gl.SliceLayout(1, st))
        if Q3:
            tok = t0 + r // HPW
            head = hbase + r % HPW
        else:
            tok = t0 + r % TPU
            head = hbase + r // TPU
        col = gl.arange(0, HD, gl.SliceLayout(0, st))
        ptrs = o_ptr + gl.expand_dims((q_start + tok).to(gl.int64) * stride_ot + head * stride_oh, 1) \
            + gl.expand_dims(col, 0)
        gl.store(ptrs, out, mask=gl.expand_dims(tok < q_len, 1))


@gluon.jit
def _pk_rows(sink_ptr, h0, window, DW: gl.constexpr, Q3: gl.constexpr = False):
    """Per-row constants of a consumer: (rt = r % 16 (Q3: r // 4), both quads' sinks (log2 units), rt + 129 - window,
    and in the diagonal tile's row layout rt and rt + 1 - window; column indices of both tiles)."""
    a_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])
    d_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DW, 16])
    r = gl.arange(0, WM, gl.SliceLayout(1, a_l))
    if Q3:
        rt = r // HPW
        hr = r % HPW
    else:
        rt = r % TPU
        hr = r // TPU
    sink0 = gl.load(sink_ptr + h0 + hr).to(gl.float32) * 1.4426950408889634        # heads 0 .. 3
    sink1 = gl.load(sink_ptr + h0 + HPW + hr).to(gl.float32) * 1.4426950408889634  # heads 4 .. 7
    lo_w = rt + 129 - window                                                 # first column in the window
    rtd = gl.expand_dims(gl.convert_layout(rt, gl.SliceLayout(1, d_l)), 1)
    lwd = gl.expand_dims(gl.convert_layout(lo_w, gl.SliceLayout(1, d_l)), 1) - 128
    ca = gl.expand_dims(gl.arange(0, 128, gl.SliceLayout(0, a_l)), 0)      # [1, 128] columns 0 .. 127
    cd = gl.expand_dims(gl.arange(0, DW, gl.SliceLayout(0, d_l)), 0)       # [1, DW] columns 128 ..
    return sink0, sink1, lo_w, rtd, lwd, ca, cd


@gluon.jit
def _pk_softmax(sa, sd, half, toff, t0s, qk_scale, sink0, sink1, lo_w, rtd, lwd, ca, cd):
    """Scores sa [WM, 128] (keys t0s - 128 ..) and sd [WM, DW] (keys t0s ..) of an item whose tokens are
    t0s + toff + r % 16 -> (P of both tiles fp32, l [WM]): masked, the sink in the row max, one FFMA + one
    ex2 a score."""
    lo = gl.maximum(lo_w + toff, 128 - t0s)                                  # keys before the sequence: masked
    xa = gl.where(ca >= gl.expand_dims(lo, 1), sa, float("-inf"))           # raw scores; qk_scale > 0
    xd = gl.where((cd <= rtd + toff) & (cd >= lwd + toff), sd, float("-inf"))
    sink = gl.where(half == 0, sink0, sink1)
    row_l: gl.constexpr = sink0.type.layout
    dr_l: gl.constexpr = gl.SliceLayout(1, sd.type.layout)
    m = gl.maximum(gl.maximum(gl.max(xa, axis=1), gl.convert_layout(gl.max(xd, axis=1), row_l)) * qk_scale,
                   sink)                                                     # the sink joins the max first
    pra = gl.exp2(xa * qk_scale - gl.expand_dims(m, 1))
    prd = gl.exp2(xd * qk_scale - gl.expand_dims(gl.convert_layout(m, dr_l), 1))
    l_i = gl.sum(pra, axis=1) + gl.convert_layout(gl.sum(prd, axis=1), row_l) + gl.exp2(sink - m)
    return pra, prd, l_i


@gluon.jit
def _pk_consumer(p, WG: gl.constexpr, NC: gl.constexpr, S: gl.constexpr, UPS: gl.constexpr, DIRECT: gl.constexpr):
    """4 warps: items WG, WG + NC, ... of the CTA's walk (item i: slot i // (2 UPS), its unit (i // 2) % UPS,
    heads 4 (i % 2) .. + 3 of the KV head; with NC = 2 warpgroup g keeps heads 4 g ..). A slot's keys are two
    wgmma tiles (tensor and slice shapes are powers of 2): columns 0 .. 127 (keys t0 - 128 .. t0 - 1: masked
    below lo only) and 128 .. 128 + 16 UPS - 1 (keys t0 ..: masked above the row's token). Each item's PV runs
    under the next item's S wgmmas; its slot gets one of its 2 UPS arrivals once that PV is done."""
    (qd, kd, kdd, vd, vdd, q_smem, km, kdg, vm, vdg, ready, empty, o_ptr, sink_ptr, stride_ot, stride_oh, qk_scale,
     window, q_start, q_len, tok0, n_units, h0, hkv) = p
    DW: gl.constexpr = UPS * TPU
    a_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])
    d_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DW, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    sink0, sink1, lo_w, rtd, lwd, ca, cd = _pk_rows(sink_ptr, h0, window, DW)
    pa = _to_a(gl.zeros([WM, 128], gl.float32, a_l), o_l)                   # the dummy item's P
    pd = _to_a(gl.zeros([WM, DW], gl.float32, d_l), o_l)
    l_prev = gl.full([WM], 1.0, gl.float32, gl.SliceLayout(1, a_l))
    t_prev = tok0 * 0 - 1048576                                              # dummy item: nothing stored
    h_prev = h0
    sp = tok0 * 0                                                            # the previous item's slot
    n_items = gl.cdiv(n_units, UPS) * (2 * UPS)
    for i in range(WG, n_items, NC):
        v = i // (2 * UPS)
        j = (i // 2) % UPS
        half = i % 2
        s = v % S
        if i == WG:
            sp = s                                                           # (dummy PV: any loaded V)
        mbarrier.wait(ready.index(s), (v // S) & 1)
        q_s = q_smem.index((s * UPS + j) * 2 + half)
        sa = warpgroup_mma(q_s, km.index(s).permute((1, 0)), gl.zeros([WM, 128], gl.float32, a_l), use_acc=False,
                           is_async=True)
        sd = warpgroup_mma(q_s, kdg.index(s).permute((1, 0)), gl.zeros([WM, DW], gl.float32, d_l),
                           use_acc=False, is_async=True)
        o = warpgroup_mma(pa, vm.index(sp), gl.zeros([WM, HD], gl.float32, o_l), use_acc=False, is_async=True)
        o = warpgroup_mma(pd, vdg.index(sp), o, is_async=True)
        sa, sd = warpgroup_mma_wait(2, deps=(sa, sd))                        # S done; the PV products may run
        t0s = tok0 + v * DW
        pra, prd, l_i = _pk_softmax(sa, sd, half, j * TPU, t0s, qk_scale, sink0, sink1, lo_w, rtd, lwd, ca, cd)
        o = warpgroup_mma_wait(0, deps=(o, ))
        if i != WG:                                                          # the previous item is done
            fence_async_shared()
            mbarrier.arrive(empty.index(sp))
        _pk_store(o, l_prev, o_ptr, q_start, q_len, t_prev, h_prev, stride_ot, stride_oh, DIRECT)
        pa = _to_a(pra, o_l)
        pd = _to_a(prd, o_l)
        l_prev = l_i
        t_prev = t0s + j * TPU
        h_prev = h0 + half * HPW
        sp = s
    # ---- the last item's PV and store (its slot is not released: nothing is loaded after it) ----
    if WG < n_items:
        o = warpgroup_mma(pa, vm.index(sp), gl.zeros([WM, HD], gl.float32, o_l), use_acc=False, is_async=True)
        o = warpgroup_mma(pd, vdg.index(sp), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=(o, ))
        _pk_store(o, l_prev, o_ptr, q_start, q_len, t_prev, h_prev, stride_ot, stride_oh, DIRECT)


@gluon.jit
def _pk_consumer_serial(p, WG: gl.constexpr, NC: gl.constexpr, S: gl.constexpr, UPS: gl.constexpr,
                        DIRECT: gl.constexpr, st, DIAG: gl.constexpr = 0, Q3: gl.constexpr = False,
                        KVR: gl.constexpr = False):
    """``_pk_consumer`` without the cross-item overlap inside a warpgroup (S, softmax, PV, store in turn: no P
    or O in flight while S is live, so 3 warpgroups fit 160 registers); the tensor core and the exps overlap
    across the warpgroups only. Each item's slot arrival right after its PV. KVR: K / V from the group ring
    (``_pk_producer_ring``): before unit v the warpgroup waits for the groups v .. v + 8 it has not waited for yet
    (in order, each on its own barrier); the window is the ring's rows from group v % 16 on, viewed as [128, 64]."""
    (qd, kd, kdd, vd, vdd, q_smem, km, kdg, vm, vdg, ready, empty, o_ptr, sink_ptr, stride_ot, stride_oh, qk_scale,
     window, q_start, q_len, tok0, n_units, h0, hkv) = p
    DW: gl.constexpr = UPS * TPU
    a_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])
    d_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DW, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
    sink0, sink1, lo_w, rtd, lwd, ca, cd = _pk_rows(sink_ptr, h0, window, DW, Q3)
    for i in range(WG, gl.cdiv(n_units, UPS) * (2 * UPS), NC):
        v = i // (2 * UPS)
        j = (i // 2) % UPS
        half = i % 2
        s = v % S
        mbarrier.wait(ready.index(s), (v // S) & 1)
        if KVR:
            # the groups after those waited for at this warpgroup's previous item (unit (i - NC) // 2: groups up to
            # its + 8), from its arithmetic and NOT a loop-carried "last group waited" (session 7's ``gw``): triton
            # 3.6's Gluon canonicalizer replaced that iter_arg's yield by the iter_arg itself (it fed only the inner
            # loop's lower bound), so every item re-waited groups 0 .. v + 8 and, once the ring wrapped (a CTA of
            # more than 8 units), waited on phases already passed twice: the direct tests' hang (bench/NOTES.md
            # session 9; ``kv_ring_protocol`` models it)
            lo = gl.where(i >= NC, (i - NC) // (2 * UPS) + 9, 0)
            for lg in range(lo, v + 9):
                mbarrier.wait(st[2].index(lg % KVG), (lg // KVG) & 1)
        if DIAG == 1:                    # diagnostic: the ring's fill rate alone (nothing computed or stored)
            mbarrier.arrive(empty.index(s))
        else:
            q_s = q_smem.index((s * UPS + j) * 2 + half)
            if KVR:
                k_win = km.index(v % KVG)._reinterpret(gl.bfloat16, [128, HD], kd.layout)   # groups v .. v + 7
                k_new = kdg.index((v + 8) % KVG)                                            # group v + 8 (t0 ..)
            else:
                k_win = km.index(s)
                k_new = kdg.index(s)
            sa = warpgroup_mma(q_s, k_win.permute((1, 0)), gl.zeros([WM, 128], gl.float32, a_l), use_acc=False,
                               is_async=True)
            sd = warpgroup_mma(q_s, k_new.permute((1, 0)), gl.zeros([WM, DW], gl.float32, d_l),
                               use_acc=False, is_async=True)
            sa, sd = warpgroup_mma_wait(0, deps=(sa, sd))
            t0s = tok0 + v * DW
            pra, prd, l_i = _pk_softmax(sa, sd, half, j * TPU, t0s, qk_scale, sink0, sink1, lo_w, rtd, lwd, ca, cd)
            if KVR:
                v_win = vm.index(v % KVG)._reinterpret(gl.bfloat16, [128, HD], vd.layout)
                v_new = vdg.index((v + 8) % KVG)
            else:
                v_win = vm.index(s)
                v_new = vdg.index(s)
            o = warpgroup_mma(_to_a(pra, o_l), v_win, gl.zeros([WM, HD], gl.float32, o_l), use_acc=False,
                              is_async=True)
            o = warpgroup_mma(_to_a(prd, o_l), v_new, o, is_async=True)
            o = warpgroup_mma_wait(0, deps=(o, ))
            if DIRECT == 3:                  # O leaves through the item's own Q box (its QK^T is done): no staging
                _pk_store_tma(o, l_i, st[0], q_s, o_ptr, q_start, q_len, t0s + j * TPU, h0 + half * HPW, stride_ot,
                              stride_oh, False, Q3)
                tma.store_wait(0)            # the stores have read the box before the slot is released
                gl.thread_barrier()
            fence_async_shared()
            mbarrier.arrive(empty.index(s))
            if DIRECT == 2:
                _pk_store_tma(o, l_i, st[0], st[1].index(WG), o_ptr, q_start, q_len, t0s + j * TPU, h0 + half * HPW,
                              stride_ot, stride_oh)
            elif DIRECT < 2:
                if DIAG == 2:                # diagnostic: no O store (a run-time condition that never holds)
                    if q_len < 0:
                        _pk_store(o, l_i, o_ptr, q_start, q_len, t0s + j * TPU, h0 + half * HPW, stride_ot,
                                  stride_oh, DIRECT == 1, Q3)
                else:
                    _pk_store(o, l_i, o_ptr, q_start, q_len, t0s + j * TPU, h0 + half * HPW, stride_ot, stride_oh,
                              DIRECT == 1, Q3)
    if DIRECT == 2:
        tma.store_wait(0)                # every store issued has read its buffer before the CTA exits


@gluon.jit
def _pk_consumer_any(p, WG: gl.constexpr, NC: gl.constexpr, S: gl.constexpr, SERIAL: gl.constexpr,
                     UPS: gl.constexpr, DIRECT: gl.constexpr, st, DIAG: gl.constexpr, Q3: gl.constexpr,
                     KVR: gl.constexpr):
    if SERIAL:
        _pk_consumer_serial(p, WG, NC, S, UPS, DIRECT, st, DIAG, Q3, KVR)
    else:
        _pk_consumer(p, WG, NC, S, UPS, DIRECT == 1)


@gluon.jit
def _pk_consumer0(p, NC: gl.constexpr, S: gl.constexpr, SERIAL: gl.constexpr, UPS: gl.constexpr,
                  DIRECT: gl.constexpr, st, DIAG: gl.constexpr, Q3: gl.constexpr, KVR: gl.constexpr):
    _pk_consumer_any(p, 0, NC, S, SERIAL, UPS, DIRECT, st, DIAG, Q3, KVR)


@gluon.jit
def _pk_consumer1(p, NC: gl.constexpr, S: gl.constexpr, SERIAL: gl.constexpr, UPS: gl.constexpr,
                  DIRECT: gl.constexpr, st, DIAG: gl.constexpr, Q3: gl.constexpr, KVR: gl.constexpr):
    _pk_consumer_any(p, 1, NC, S, SERIAL, UPS, DIRECT, st, DIAG, Q3, KVR)


@gluon.jit
def _pk_consumer2(p, NC: gl.constexpr, S: gl.constexpr, SERIAL: gl.constexpr, UPS: gl.constexpr,
                  DIRECT: gl.constexpr, st, DIAG: gl.constexpr, Q3: gl.constexpr, KVR: gl.constexpr):
    _pk_consumer_any(p, 2, NC, S, SERIAL, UPS, DIRECT, st, DIAG, Q3, KVR)


@gluon.jit
def window_packed_kernel(qd, kd, kdd, vd, vdd, cu_ptr, sink_ptr, o_ptr, stride_ot, stride_oh, qk_scale, window,
                         units_per_cta, q_ptr, k_ptr, v_ptr, stride_qt, stride_kt, stride_vt, od, GROUP: gl.constexpr,
                         S: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                         num_warps: gl.constexpr, NC: gl.constexpr = 2, SERIAL: gl.constexpr = False,
                         UPS: gl.constexpr = 1, DIRECT: gl.constexpr = False, PF: gl.constexpr = 0,
                         DIAG: gl.constexpr = 0, Q3: gl.constexpr = False, KVR: gl.constexpr = False):
    """Grid (KV heads, chunks of ``units_per_cta`` units of 16 tokens (a multiple of UPS), sequences). DIRECT: how
    O is stored (0 through a layout conversion, 1 from the wgmma layout, 2 TMA from a staging buffer per consumer
    warpgroup, 3 TMA from the item's Q box, released after the stores read it; 2 and 3: ``od`` the descriptor of
    out's [16, 64] boxes, None otherwise). DIAG (serial only): 0 the kernel, 1 / 2 diagnostics (config ``diag``).
    Q3: rows (token, head), ``qd`` (and ``od``) 3D descriptors of [16, 4, 64] boxes (config ``q3d``). KVR: the K / V
    group ring (config ``kv_ring``; S Q slots, ``kdd`` / ``vdd`` boxes of 16 rows)."""
    NWG: gl.constexpr = GROUP // HPW     # head quads a unit (2)
    hkv = gl.program_id(0)
    b = gl.program_id(2)
    q_start = gl.load(cu_ptr + b)
    q_len = gl.load(cu_ptr + b + 1) - q_start
    u0 = gl.program_id(1) * units_per_cta
    n_units = gl.minimum(gl.cdiv(q_len, TPU) - u0, units_per_cta)
    if n_units <= 0:
        return
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [S * UPS * NWG, WM, HD], kd.layout)  # (128-byte swizzle)
    if KVR:   # one ring each for K and V: 16 groups of 16 keys + groups 0-7 mirrored (48 KB each)
        km = gl.allocate_shared_memory(gl.bfloat16, [KVG + 8, TPU, HD], kdd.layout)
        vm = gl.allocate_shared_memory(gl.bfloat16, [KVG + 8, TPU, HD], vdd.layout)
        kdg = km
        vdg = vm
        kvb = gl.allocate_shared_memory(gl.int64, [KVG, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(KVG):
            mbarrier.init(kvb.index(i), count=1)
    else:
        km = gl.allocate_shared_memory(gl.bfloat16, [S, 128, HD], kd.layout)
        kdg = gl.allocate_shared_memory(gl.bfloat16, [S, UPS * TPU, HD], kdd.layout)
        vm = gl.allocate_shared_memory(gl.bfloat16, [S, 128, HD], vd.layout)
        vdg = gl.allocate_shared_memory(gl.bfloat16, [S, UPS * TPU, HD], vdd.layout)
    if DIRECT == 2:
        o_stage = gl.allocate_shared_memory(gl.bfloat16, [NC, WM, HD], kd.layout)
    else:
        o_stage = q_smem                                                         # (unused: no allocation)
    if KVR:
        st = (od, o_stage, kvb)
    else:
        st = (od, o_stage)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=NWG * UPS)   # each of a slot's items releases it once
    fence_async_shared()
    p = (qd, kd, kdd, vd, vdd, q_smem, km, kdg, vm, vdg, ready, empty, o_ptr, sink_ptr, stride_ot, stride_oh,
         qk_scale, window, q_start, q_len, u0 * TPU, n_units, hkv * GROUP, hkv)
    pf = (q_ptr, k_ptr, v_ptr, stride_qt, stride_kt, stride_vt)
    # (constexprs written out in each tuple: a shared tuple of them would turn them into tensors)
    if NC == 2:
        gl.warp_specialize([(_pk_consumer0, (p, NC, S, SERIAL, UPS, DIRECT, st, DIAG, Q3, KVR)),
                            (_pk_consumer1, (p, NC, S, SERIAL, UPS, DIRECT, st, DIAG, Q3, KVR)),
                            (_pk_producer, (p, NWG, S, UPS, PF, pf, GROUP, Q3, KVR, st))], [4, 1],
                           [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([(_pk_consumer0, (p, NC, S, SERIAL, UPS, DIRECT, st, DIAG, Q3, KVR)),
                            (_pk_consumer1, (p, NC, S, SERIAL, UPS, DIRECT, st, DIAG, Q3, KVR)),
                            (_pk_consumer2, (p, NC, S, SERIAL, UPS, DIRECT, st, DIAG, Q3, KVR)),
                            (_pk_producer, (p, NWG, S, UPS, PF, pf, GROUP, Q3, KVR, st))], [4, 4, 1],
                           [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


def _store_mode(cfg: GluonWindowPackedConfig) -> int:
    """The kernel's DIRECT constexpr: 0 layout conversion, 1 wgmma layout, 2 TMA via staging, 3 TMA via the Q box.
    Also refuses a ring whose consumers would skip phases of a ``ready`` barrier (a race:
    ``ring_waits_every_phase``)."""
    if not ring_waits_every_phase(cfg.nc, cfg.stages, cfg.ups):
        raise ValueError(f"{cfg.nc} consumer warpgroups over {cfg.stages} slots of {cfg.ups} unit(s): a warpgroup "
                         f"would skip phases of a ready barrier (nc 3 with ups 1 needs stages a multiple of 3); "
                         f"config {cfg}")
    if (cfg.tma_store or cfg.store_via_q) and not cfg.serial:
        raise ValueError(f"TMA stores of O are built for the serial consumers only; config {cfg}")
    if cfg.kv_ring and (not cfg.serial or cfg.ups != 1 or cfg.tma_store or cfg.store_via_q or cfg.direct_store
                        or cfg.prefetch or 8 + cfg.stages > 16):
        raise ValueError(f"kv_ring is built for the serial consumers, one unit a slot, store mode 0, no prefetch and "
                         f"at most 8 Q slots; config {cfg}")
    if cfg.q3d and (not cfg.serial or cfg.tma_store or cfg.direct_store):
        raise ValueError(f"q3d is built for the serial consumers with store modes 0 / 3 only; config {cfg}")
    return 3 if cfg.store_via_q else 2 if cfg.tma_store else int(cfg.direct_store)


def _diag_mode(cfg: GluonWindowPackedConfig) -> int:
    """The kernel's DIAG constexpr (serial consumers only; ``diag`` > 0 writes no or part of the output)."""
    if cfg.diag and not cfg.serial:
        raise ValueError(f"the diagnostics are built for the serial consumers only; config {cfg}")
    if cfg.diag not in (0, 1, 2):
        raise ValueError(f"diag must be 0, 1 or 2; config {cfg}")
    return cfg.diag


def window_packed_attention(q, k, v, cu_seqlens_q, sinks, scale: float, window: int, max_seqlen_q: int,
                            out: torch.Tensor, cfg: GluonWindowPackedConfig) -> torch.Tensor:
    """Launch version 2 (checks done by ``gluon_attention_window.window_attention``); returns ``out``."""
    T, Hq, D = q.shape
    hkv = k.shape[1]
    group = PK_HEADS * cfg.nwg   # (plain ints: HPW is a constexpr and prints as one)
    if Hq // hkv != group:
        raise ValueError(f"the packed Gluon window kernel needs a GQA group of {group} query heads per KV head "
                         f"(2 quads of 4); got {Hq // hkv}")
    B = cu_seqlens_q.shape[0] - 1
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    per, n_chunks = packed_chunk(max_seqlen_q, B * hkv, sms, cfg.min_units, cfg.ups)
    dw = PK_TOK * cfg.ups
    mode = _store_mode(cfg)
    if cfg.q3d:
        qd, od = _quad_desc(q), (_quad_desc(out) if mode >= 2 else None)
    else:
        qd, od = _box_desc(q, PK_TOK), (_box_desc(out, PK_TOK) if mode >= 2 else None)
    window_packed_kernel[(hkv, n_chunks, B)](qd, _box_desc(k, 128), _box_desc(k, dw),
                                             _box_desc(v, 128), _box_desc(v, dw), cu_seqlens_q, sinks, out,
                                             out.stride(0), out.stride(1), scale * LOG2E, window, per, q, k, v,
                                             q.stride(0), k.stride(0), v.stride(0),
                                             od,
                                             GROUP=Hq // hkv,
                                             S=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
                                             PRODUCER_REGS=cfg.producer_regs, num_warps=4, maxnreg=cfg.maxnreg,
                                             NC=cfg.nc, SERIAL=cfg.serial, UPS=cfg.ups,
                                             DIRECT=mode, PF=cfg.prefetch, DIAG=_diag_mode(cfg), Q3=cfg.q3d,
                                             KVR=cfg.kv_ring)
    return out


__all__ = ["GluonWindowPackedConfig", "window_packed_attention", "window_packed_kernel"]
