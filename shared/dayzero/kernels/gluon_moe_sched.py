"""Dynamic tile scheduling of the persistent Gluon MoE GEMMs (``gluon_moe_gemm128``, SCHED 1).

The static walk hands CTA c the tiles c, c + P, c + 2P, ... (P persistent CTAs): every CTA gets the same
number of tiles whatever they cost, so tiles of uneven cost (full / half tiles, the narrow last N tile,
memory contention) leave CTAs idle at the end of the launch (Gluon run 7's trace: the launch spans 5-12 %
more than the average CTA's busy time). With SCHED 1 a CTA's first tile is its program id and each
further one comes from a global counter (``atomic_add``, zeroed by the host before the launch): whichever
CTA frees up first takes the next walk position. The producer warp takes the position and hands it to
both consumer warpgroups through a two-slot ring in shared memory (mbarriers ``tfull``, count 1, and
``tempty``, count 2: both consumers read the slot before the producer reuses it); a position past the
last tile ends every partition's loop. Imported only with the Gluon kernels (Gluon path selected).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

SLOT = gl.constexpr(32)   # int32 words per ring slot (one per lane of a warp)


@gluon.jit
def _publish(tiles_smem, tfull, tempty, k, tile):
    """Producer (1 warp): hand walk position ``tile``, this CTA's k-th, to both consumers (slot k % 2)."""
    slot = k % 2
    mbarrier.wait(tempty.index(slot), ((k // 2) & 1) ^ 1)
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    tiles_smem.index(slot).store(gl.full([SLOT], tile, gl.int32, lay))
    mbarrier.arrive(tfull.index(slot))


@gluon.jit
def _receive(tiles_smem, tfull, tempty, k):
    """Consumer (4 warps): this CTA's k-th walk position (past the last tile: the end). The max over the
    slot's 32 words: the producer's arrive releases at least its elected lane's word, and every older word
    in the slot is smaller (zeros at the start, then this CTA's earlier positions, which only grow)."""
    slot = k % 2
    mbarrier.wait(tfull.index(slot), (k // 2) & 1)
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    tile = gl.max(tiles_smem.index(slot).load(lay), axis=0)
    mbarrier.arrive(tempty.index(slot))
    return tile


@gluon.jit
def _next(counter_ptr):
    """The next walk position for this CTA (after its first, the program id): P + the counter's old value."""
    return gl.num_programs(0) + gl.atomic_add(counter_ptr, 1)
