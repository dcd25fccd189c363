"""Programmatic dependent launch (PDL) between the decode MoE's gate_up and down kernels
(``triton_moe_small_split`` / ``triton_moe_small_gemv``, tiles with ``SplitTiles.pdl``).

  * gate_up calls ``trigger`` first (``griddepcontrol.launch_dependents``): once every gate_up program
    has run it, the down grid (launched with ``launch_pdl``) is started and its programs become
    resident beside gate_up's;
  * a down program finds its expert slot (the ids were written before gate_up started: visible), then
    ``wait`` (``griddepcontrol.wait``: gate_up complete, its h visible) before its first load of h or
    any global store.
Run 11 (bench/NOTES.md "MoE decode run 11"): at T = 1 PDL made the call slower (40.5 -> 49.1 us with the
GEMV gate_up: the early down programs cost gate_up more than the boundary they save); at T = 2-4 the
tiles with PDL were the fastest measured (shipped there). An L2 bulk prefetch of the weight tiles before
the wait (``cp.async.bulk.prefetch.L2``, 64-720 B pieces, one per thread) made every kernel 30-100 %
slower and was removed (source in commit cfa8ddf). Both instructions are harmless without PDL; the CPU
interpreter runs neither (callers pass ``ON`` off there).
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
