"""Per-M-block tile info of the folded-tail Gluon MoE GEMM (``gluon_moe_fold``): one small Triton launch after
the align step (no host sync), from the alignment's sorted ids and expert runs (``AlignedPairs.block_span``),
the rule of ``gluon_moe_fold_plan`` (read it). info[b] = kind (0 = full tile, 1 = fold, 2 = absorbed, 3 = half
tile: rows 64-127 padding) + 4 * the first sorted row of a fold block's tail slice: the GEMM reads one int32 a
tile, issued with block_expert's load (BM128 loads the block's sorted id 64 there instead). Importing this module imports triton: only ``gluon_moe_gemm_run`` imports it,
when a fold configuration runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_moe_align import AlignedPairs

NB = 128  # blocks per program


@triton.jit
def _fold_info_kernel(sorted_ids_ptr, span_ptr, block_expert_ptr, info_ptr, P, num_blocks, TT: tl.constexpr,
                      R: tl.constexpr, BM: tl.constexpr, NB: tl.constexpr):
    b = tl.program_id(0) * NB + tl.arange(0, NB)
    ok = b < num_blocks
    used = ok & (tl.load(block_expert_ptr + b, mask=ok, other=-1) >= 0)
    first = tl.load(span_ptr + 2 * b, mask=used, other=0)
    last = first + tl.load(span_ptr + 2 * b + 1, mask=used, other=1) - 1   # the run's last block
    F = last - first                                                        # blocks before it
    tb = last * BM
    fits = tl.load(sorted_ids_ptr + tb + tl.minimum(TT * F, R), mask=used, other=0) >= P  # <= min(TT F, R) rows
    folded = used & (F > 0) & fits
    j = b - first
    has = tl.load(sorted_ids_ptr + tb + tl.minimum(TT * j, BM - 1), mask=used, other=P) < P   # slice j has rows
    fold = folded & (b < last) & has
    half = tl.load(sorted_ids_ptr + b * BM + BM // 2, mask=used, other=0) >= P      # rows 64-127 padding
    info = tl.where(fold, (tb + TT * j) * 4 + 1, tl.where(folded & (b == last), 2, tl.where(half, 3, 0)))
    tl.store(info_ptr + b, info, mask=ok)


def fold_info(al: AlignedPairs, tail: int, max_rows: int = 64) -> torch.Tensor:
    """[Mpad // 128] int32 tile info (module docstring) of an alignment made with ``span=True``; ``max_rows``: the
    most rows of a tail that is folded (1-127)."""
    if al.block_m != 128 or al.block_span is None or tail not in (16, 32) or not 0 < max_rows < 128:
        raise ValueError(f"fold info needs 128-row blocks with block_span, a tail of 16 or 32 rows and max_rows in "
                         f"[1, 127] (block_m {al.block_m}, span {al.block_span is not None}, tail {tail}, "
                         f"max_rows {max_rows})")
    nb = al.block_expert.numel()
    info = torch.empty((nb, ), dtype=torch.int32, device=al.block_expert.device)
    _fold_info_kernel[(triton.cdiv(nb, NB), )](al.sorted_ids, al.block_span, al.block_expert, info, al.num_pairs, nb,
                                               TT=tail, R=max_rows, BM=128, NB=NB, num_warps=4)
    return info
