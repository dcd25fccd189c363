"""Kernel-boundary helpers of the decode MoE (``triton_moe_small_split`` / ``triton_moe_small_gemv``):
programmatic dependent launch (PDL) between gate_up and down, and bulk L2 prefetch of weight tiles.

At T = 1 the down kernel's weights do not depend on gate_up's output (only h does), but without PDL
its programs start only after the last gate_up program ended, then stream 33 MB at ~1.8 TB/s while
gate_up (issue-bound) leaves ~1/3 of the DRAM bandwidth unused. With ``PDL``:
  * gate_up calls ``trigger`` first (``griddepcontrol.launch_dependents``): once every gate_up program
    has run it, the down grid is launched and its programs become resident beside gate_up's;
  * a down program finds its expert (ids written before gate_up started: visible), bulk-prefetches
    its weight tile into L2 (``prefetch_rows``: ``cp.async.bulk.prefetch.L2``, no registers or shared
    memory held, nothing waited for), then ``wait`` (``griddepcontrol.wait``: gate_up complete, its h
    visible) before its first load of h or any global store.
``EVICT_LAST`` marks the prefetched lines evict-last (``createpolicy``) so gate_up's streaming reads
(``evict_first``) do not push them out of L2 before use. Both instructions are no-ops without PDL /
harmless when repeated; the CPU interpreter runs none of them (callers pass the flags off there).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def trigger(ON: tl.constexpr):
    """Let the dependent grid (launched with ``launch_pdl``) start once every program got here."""
    if ON:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def wait(ON: tl.constexpr):
    """Block until the grid this one depends on has completed and its stores are visible."""
    if ON:
        tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _bulk_prefetch(ptrs, nbytes, EVICT_LAST: tl.constexpr):
    """``cp.async.bulk.prefetch.L2`` of nbytes (multiple of 16, 16-byte aligned; 0: none) at each pointer."""
    if EVICT_LAST:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b64 pol; setp.ne.u32 p, $2, 0; "
            "createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
            "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, nbytes], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_rows(row_ptrs, rows_ok, k0, k1, BN: tl.constexpr, EVICT_LAST: tl.constexpr):
    """Prefetch bytes [k0, k1) of each of the BN rows at ``row_ptrs`` [BN] (FP8: one byte per weight; k0,
    k1 and the row pitch multiples of 16) into L2, as 4 pieces per row ([BN, 4]: one piece per thread of
    a 4-warp program at BN = 32, no duplicate requests)."""
    n = k1 - k0
    piece = ((n + 63) // 64) * 16                                   # ceil(n / 4) rounded up to 16
    q = tl.arange(0, 4)
    start = q * piece
    size = tl.maximum(tl.minimum(n - start, piece), 0)
    size = tl.where(rows_ok[:, None], size[None, :], 0)
    _bulk_prefetch(row_ptrs[:, None] + k0 + start[None, :], size.to(tl.int32), EVICT_LAST)
