"""Sort (token, slot) pairs by expert and pad every expert's run to a multiple of the GEMM's M block.

Pure device-side torch ops, no host synchronisation (no ``.item()``, no ``bincount``), so the
result has static shapes and the whole MoE can be captured in a CUDA graph. The padded length is
the worst case ``P + E * (BM - 1)``; blocks past the real end get expert -1 and the GEMM kernel
returns from them at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AlignedPairs:
    sorted_ids: torch.Tensor    # [Mpad] int32: pair id (token * topk + slot), P = padding
    block_expert: torch.Tensor  # [Mpad // BM] int32: expert of each M block, -1 = empty
    num_pairs: int              # P = T * topk
    block_m: int

    @property
    def padded_rows(self) -> int:
        return self.sorted_ids.shape[0]


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    rows = num_pairs + num_experts * (block_m - 1)
    return (rows + block_m - 1) // block_m * block_m


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int, offset: int = 0) -> AlignedPairs:
    """ids [T, topk] int (global expert of each pair) -> AlignedPairs over the local experts
    ``[offset, offset + num_experts)``; pairs routed elsewhere (other EP ranks) are left out."""
    if ids.dim() != 2:
        raise ValueError(f"expert ids must be [T, topk], got shape {tuple(ids.shape)}")
    dev = ids.device
    E = num_experts
    local = ids.reshape(-1).to(torch.int64) - offset                          # [P]
    local = torch.where((local >= 0) & (local < E), local, E)                 # E = not on this rank
    P = local.numel()
    mpad = max_padded_rows(P, E, block_m)
    counts = torch.zeros(E + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, local, torch.ones_like(local))                     # [E + 1]
    padded = (counts + block_m - 1) // block_m * block_m
    padded[E] = 0
    ends = torch.cumsum(counts, 0)
    pends = torch.cumsum(padded, 0)
    order = torch.argsort(local, stable=True)                                 # [P] pair ids by expert
    e_sorted = local[order]
    pos = (pends - padded)[e_sorted] + torch.arange(P, device=dev) - (ends - counts)[e_sorted]
    pos = torch.where(e_sorted < E, pos, mpad)                                # foreign pairs -> dump slot
    sorted_ids = torch.full((mpad + 1,), P, dtype=torch.int32, device=dev)
    sorted_ids[pos] = order.to(torch.int32)
    block_start = torch.arange(0, mpad, block_m, device=dev)
    block_expert = torch.searchsorted(pends[:E].contiguous(), block_start, right=True)  # first e with end > start
    block_expert = torch.where(block_expert < E, block_expert, -1).to(torch.int32)
    return AlignedPairs(sorted_ids=sorted_ids[:mpad], block_expert=block_expert, num_pairs=P, block_m=block_m)
