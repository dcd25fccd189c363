"""Tile-walk helpers of the 128-row Gluon MoE GEMM (``gluon_moe_gemm128``): which work a (M block,
N tile) of the persistent walk stands for, and the per-tile timing trace (a diagnostic).

HALF 4 ("merge"): an expert's half block (rows 64-127 padding; always the expert's last block) that
follows a full block of the same expert is run by the CTA that runs that full block, right after it,
on the same N tile (its W tile is then an L2 hit and no other CTA streams it at the same time); the
walk's own visit of the half block does nothing. A half block with no full block before it (an expert
of at most 64 rows) runs on its own. Producer and consumers call ``_tile_plan`` with the same
arguments, so their stage counters stay in step.
Imported only with ``gluon_moe_gemm128`` (Gluon path selected).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

BM = gl.constexpr(128)
HM = gl.constexpr(64)


@gluon.jit
def _is_full(sorted_ids_ptr, pid_m, num_pairs):
    """Whether rows 64-127 of M block pid_m hold a routed pair (else the block is a half tile)."""
    return gl.load(sorted_ids_ptr + pid_m * BM + HM) < num_pairs


@gluon.jit
def _tile_plan(sorted_ids_ptr, block_expert_ptr, pid_m, e, used_m, num_pairs, HALF: gl.constexpr):
    """(full, run_self, merge_next) of M block pid_m of expert e: run_self = run the block's own tile
    (False for a half block merged into the full block before it, HALF 4); merge_next = also run the
    next block (this expert's half block) right after it (HALF 4)."""
    full = _is_full(sorted_ids_ptr, pid_m, num_pairs)
    run_self = full | True
    merge_next = full & False
    if HALF == 4:
        prev_e = gl.load(block_expert_ptr + gl.maximum(pid_m - 1, 0))
        run_self = full | (pid_m == 0) | (prev_e != e)
        nxt = gl.minimum(pid_m + 1, used_m - 1)
        nxt_e = gl.load(block_expert_ptr + nxt)
        merge_next = full & (pid_m + 1 < used_m) & (nxt_e == e) & (not _is_full(sorted_ids_ptr, nxt, num_pairs))
    return full, run_self, merge_next


@gluon.jit
def _next(tile, sub, merge_next):
    """The walk's next (tile, sub): the merged half tile (sub 1) after a full tile that has one, else
    the next round-robin tile."""
    stay = merge_next & (sub == 0)
    return gl.where(stay, tile, tile + gl.num_programs(0)), stay.to(gl.int32)


@gluon.jit
def _now():
    """The global nanosecond timer (diagnostic trace)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _trace(trace_ptr, tile, t0, pid_m, full, run_self, merge_next):
    """trace [2 * tile + sub, 4] int64: start ns, end ns, M block, kind (bit 0 full, bit 1 ran, bit 2 merge_next)."""
    base = trace_ptr + tile.to(gl.int64) * 4
    gl.store(base, t0)
    gl.store(base + 1, _now())
    gl.store(base + 2, pid_m.to(gl.int64))
    gl.store(base + 3, (full.to(gl.int64) + 2 * run_self.to(gl.int64) + 4 * merge_next.to(gl.int64)))
