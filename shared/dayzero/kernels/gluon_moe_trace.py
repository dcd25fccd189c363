"""Per-tile timing trace of the 128-row Gluon MoE GEMM (``gluon_moe_gemm128``, TRACE, a diagnostic):
warpgroup 0 of every CTA writes each tile's start and end %globaltimer, its M block and whether it was
a full tile; ``bench/moe/gluon_trace.py`` summarises it. Imported only with ``gluon_moe_gemm128``
(Gluon path selected).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _now():
    """The global nanosecond timer."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _trace(trace_ptr, tile, t0, pid_m, full):
    """trace [tile, 4] int64: start ns, end ns, M block, 1 = full tile / 2 = half tile (0: not reached)."""
    base = trace_ptr + tile.to(gl.int64) * 4
    gl.store(base, t0)
    gl.store(base + 1, _now())
    gl.store(base + 2, pid_m.to(gl.int64))
    gl.store(base + 3, 2 - full.to(gl.int64))
