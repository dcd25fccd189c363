"""Sort (token, slot) pairs by expert and pad every expert's run to a multiple of the GEMM's M block.

Three small Triton kernels, no host synchronisation, static shapes (CUDA-graph friendly):
  1. count: per chunk of pairs, a histogram over the local experts (+1 bin for routes owned by
     other EP ranks);
  2. scan (one program): expert totals, padded run starts, the padding sentinels, the expert of
     every M block (-1 past the end) and one write cursor per expert;
  3. scatter: each pair takes a slot in its expert's run with an atomic increment of the cursor.
The order of pairs inside an expert's run is therefore not fixed, but every GEMM row is computed
independently of its neighbours, so results do not depend on it. The padded length is the worst
case ``P + E * (BM - 1)``; blocks past the real end get expert -1 and the GEMMs return at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

CHUNK = 1024  # pairs per count/scatter program


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


@triton.jit
def _local_expert(ids_ptr, i, P, offset, E):
    e = tl.load(ids_ptr + i, mask=i < P, other=-1).to(tl.int32) - offset
    return tl.where((i < P) & (e >= 0) & (e < E), e, E)                 # E: not on this rank


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, P, offset, E, CH: tl.constexpr, EB: tl.constexpr):
    c = tl.program_id(0)
    e = _local_expert(ids_ptr, c * CH + tl.arange(0, CH), P, offset, E)
    tl.store(counts_ptr + c * EB + tl.arange(0, EB), tl.histogram(e, EB))


@triton.jit
def _scan_kernel(counts_ptr, cursor_ptr, sorted_ids_ptr, block_expert_ptr, num_chunks, E, P, num_blocks,
                 BM: tl.constexpr, EB: tl.constexpr, NBT: tl.constexpr):
    ex = tl.arange(0, EB)
    tot = tl.zeros((EB,), tl.int32)
    for c in range(num_chunks):
        tot += tl.load(counts_ptr + c * EB + ex)
    tot = tl.where(ex < E, tot, 0)
    padded = (tot + BM - 1) // BM * BM
    pend = tl.cumsum(padded, 0)
    pstart = pend - padded
    tl.store(cursor_ptr + ex, pstart, mask=ex < E)
    j = tl.arange(0, BM)
    slot = (pstart + tot)[:, None] + j[None, :]                          # padding rows of each run
    tl.store(sorted_ids_ptr + slot, P, mask=(slot < pend[:, None]) & (ex < E)[:, None])
    total = tl.sum(padded, 0)
    pend_e = tl.where(ex < E, pend, 2147483647)
    for b0 in range(0, num_blocks, NBT):
        b = b0 + tl.arange(0, NBT)
        start = b * BM
        owner = tl.sum((pend_e[None, :] <= start[:, None]).to(tl.int32), axis=1)  # experts ending before
        tl.store(block_expert_ptr + b, tl.where(start < total, owner, -1), mask=b < num_blocks)


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ids_ptr, P, offset, E, CH: tl.constexpr):
    i = tl.program_id(0) * CH + tl.arange(0, CH)
    e = _local_expert(ids_ptr, i, P, offset, E)
    ok = e < E
    pos = tl.atomic_add(cursor_ptr + tl.where(ok, e, 0), 1, mask=ok)
    tl.store(sorted_ids_ptr + pos, i, mask=ok)


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int, offset: int = 0) -> AlignedPairs:
    """ids [T, topk] int (global expert of each pair) -> AlignedPairs over the local experts
    ``[offset, offset + num_experts)``; pairs routed elsewhere (other EP ranks) are left out."""
    if ids.dim() != 2:
        raise ValueError(f"expert ids must be [T, topk], got shape {tuple(ids.shape)}")
    ids = ids.contiguous()
    dev, E, P = ids.device, num_experts, ids.numel()
    mpad = max_padded_rows(P, E, block_m)
    nb = mpad // block_m
    ch = min(CHUNK, max(16, triton.next_power_of_2(P)))
    nchunks = triton.cdiv(P, ch)
    eb = triton.next_power_of_2(E + 1)
    counts = torch.empty((nchunks, eb), dtype=torch.int32, device=dev)
    cursor = torch.empty((eb,), dtype=torch.int32, device=dev)
    sorted_ids = torch.empty((mpad,), dtype=torch.int32, device=dev)
    block_expert = torch.empty((nb,), dtype=torch.int32, device=dev)
    if P:
        _count_kernel[(nchunks,)](ids, counts, P, offset, E, CH=ch, EB=eb, num_warps=4)
        _scan_kernel[(1,)](counts, cursor, sorted_ids, block_expert, nchunks, E, P, nb,
                           BM=block_m, EB=eb, NBT=max(16, min(256, 4096 // eb)), num_warps=4)
        _scatter_kernel[(nchunks,)](ids, cursor, sorted_ids, P, offset, E, CH=ch, num_warps=4)
    else:
        block_expert.fill_(-1)
    return AlignedPairs(sorted_ids=sorted_ids, block_expert=block_expert, num_pairs=P, block_m=block_m)
