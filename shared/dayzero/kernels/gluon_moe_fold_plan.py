"""The tile kinds of the folded-tail Gluon MoE GEMM (``gluon_moe_fold``, ``GluonConfig.fold``) in torch: what
``gluon_moe_fold_info`` writes per M block for the kernel, for tests and the bench's tile counts. Torch only
(no triton): importable everywhere.

For 128-row align blocks (``AlignedPairs`` of ``triton_moe_align``: every expert's run padded to whole blocks,
padding slots = num_pairs, block_expert -1 past the used blocks), a tail slice of TT rows and a cap R on the
rows of a folded tail (``GluonConfig.fold_max``: 64 = only tails that would be half tiles, 127 = any): an expert
whose run has F >= 1 blocks before its last block t, and whose last block holds at most min(TT * F, R) real rows
(and is not full), has its tail *folded*: its j-th block (j < F) computes the tail rows [TT j, TT j + TT) of block t as well,
if that slice holds a real row (kind FOLD, tail row start t * 128 + TT j), and block t itself is ABSORBED
(nothing to do). Every other block is FULL if its rows 64-127 hold a routed pair, else HALF (as
``gluon_moe_gemm128``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FULL, HALF, FOLD, ABSORBED = 0, 1, 2, 3
BLOCK = 128


@dataclass(frozen=True)
class FoldCounts:
    """Used M blocks by kind (``fold_plan``)."""

    full: int
    half: int
    fold: int
    absorbed: int

    @property
    def tiles(self) -> int:
        """Tiles that load and compute (every kind but ABSORBED), per N tile."""
        return self.full + self.half + self.fold


def fold_plan(sorted_ids: torch.Tensor, block_expert: torch.Tensor, num_pairs: int, tail: int,
              max_rows: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """sorted_ids [Mpad] int32, block_expert [Mpad // 128] int32 -> (kind [used] int64: FULL / HALF / FOLD /
    ABSORBED, tail_row [used] int64: first sorted row of a FOLD block's tail slice, else 0); ``tail`` = TT
    (0: no folding), ``max_rows`` = R (1-127)."""
    if sorted_ids.dim() != 1 or sorted_ids.numel() != block_expert.numel() * BLOCK:
        raise ValueError(f"expected 128-row blocks: sorted_ids [{block_expert.numel() * BLOCK}], got "
                         f"{tuple(sorted_ids.shape)}")
    if not 0 <= tail <= BLOCK // 2 or not 0 < max_rows < BLOCK:
        raise ValueError(f"tail must be in [0, {BLOCK // 2}] and max_rows in [1, {BLOCK - 1}], got {tail}, {max_rows}")
    be = block_expert.long().cpu()
    used = int((be >= 0).sum())
    ids = sorted_ids.long().cpu()
    be = be[:used]
    b = torch.arange(used)
    kind = torch.where(ids.view(-1, BLOCK)[:used, BLOCK // 2] < num_pairs, FULL, HALF)
    tail_row = torch.zeros(used, dtype=torch.int64)
    if not tail or not used:
        return kind, tail_row
    start = torch.ones(used, dtype=torch.bool)
    start[1:] = be[1:] != be[:-1]                                          # first block of each run
    first = torch.cummax(torch.where(start, b, 0), 0).values
    end = torch.ones(used, dtype=torch.bool)
    end[:-1] = start[1:]
    last = torch.flip(torch.cummin(torch.flip(torch.where(end, b, used), [0]), 0).values, [0])
    F = last - first
    tb = last * BLOCK

    def real(slot):
        return ids[tb + slot.clamp(max=BLOCK - 1)] < num_pairs

    folded = (F > 0) & ~real((tail * F).clamp(max=max_rows))
    j = b - first
    fold = folded & (b < last) & real(tail * j)
    kind = torch.where(fold, FOLD, torch.where(folded & (b == last), ABSORBED, kind))
    return kind, torch.where(fold, tb + tail * j, 0)


def fold_counts(sorted_ids: torch.Tensor, block_expert: torch.Tensor, num_pairs: int, tail: int,
                max_rows: int = 64) -> FoldCounts:
    kind, _ = fold_plan(sorted_ids, block_expert, num_pairs, tail, max_rows)
    return FoldCounts(*(int((kind == k).sum()) for k in (FULL, HALF, FOLD, ABSORBED)))
