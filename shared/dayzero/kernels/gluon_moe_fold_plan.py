"""The tile kinds of the folded-tail Gluon MoE GEMM (``gluon_moe_fold``, ``GluonConfig.fold``) in torch: what
the kernel derives per M block from the align output, for tests and the bench's tile counts. Torch only (no
triton): importable everywhere.

For 128-row align blocks (``AlignedPairs`` of ``triton_moe_align``: every expert's run padded to whole blocks,
padding slots = num_pairs, block_expert -1 past the used blocks), block b is
  FOLD      if block b + 1 belongs to the same expert and holds at most ``tail`` real rows (its slot ``tail``
            is padding): the tile of b also computes those rows;
  ABSORBED  if it is the block b + 1 of some FOLD block b (nothing to do);
  FULL      if its rows 64-127 hold a routed pair, else HALF (as ``gluon_moe_gemm128``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FULL, HALF, FOLD, ABSORBED = 0, 1, 2, 3
BLOCK = 128


@dataclass(frozen=True)
class FoldCounts:
    """Used M blocks by kind (``fold_kinds``)."""

    full: int
    half: int
    fold: int
    absorbed: int

    @property
    def tiles(self) -> int:
        """Tiles that load and compute (every kind but ABSORBED), per N tile."""
        return self.full + self.half + self.fold


def fold_kinds(sorted_ids: torch.Tensor, block_expert: torch.Tensor, num_pairs: int, tail: int) -> torch.Tensor:
    """sorted_ids [Mpad] int32, block_expert [Mpad // 128] int32 -> kind of each used block [used] int64
    (FULL / HALF / FOLD / ABSORBED; ``tail`` = 0: no folding)."""
    if sorted_ids.dim() != 1 or sorted_ids.numel() != block_expert.numel() * BLOCK:
        raise ValueError(f"expected 128-row blocks: sorted_ids [{block_expert.numel() * BLOCK}], got "
                         f"{tuple(sorted_ids.shape)}")
    if not 0 <= tail < BLOCK // 2 + 1:
        raise ValueError(f"tail must be in [0, {BLOCK // 2}], got {tail}")
    be = block_expert.long().cpu()
    used = int((be >= 0).sum())
    rows = sorted_ids.long().cpu().view(-1, BLOCK)[:used]
    be = be[:used]
    kind = torch.where(rows[:, BLOCK // 2] < num_pairs, FULL, HALF)
    if tail and used > 1:
        same_next = be[1:] == be[:-1]                                     # block b + 1 continues b's expert
        short_next = rows[1:, tail] >= num_pairs                          # block b + 1 has <= tail real rows
        fold = torch.zeros(used, dtype=torch.bool)
        fold[:-1] = same_next & short_next
        absorbed = torch.zeros(used, dtype=torch.bool)
        absorbed[1:] = fold[:-1]
        kind = torch.where(fold, FOLD, torch.where(absorbed, ABSORBED, kind))
    return kind


def fold_counts(sorted_ids: torch.Tensor, block_expert: torch.Tensor, num_pairs: int, tail: int) -> FoldCounts:
    kind = fold_kinds(sorted_ids, block_expert, num_pairs, tail)
    return FoldCounts(*(int((kind == k).sum()) for k in (FULL, HALF, FOLD, ABSORBED)))
