"""Tile kinds of the folded-tail Gluon MoE GEMM (``gluon_moe_fold_plan``, torch only) on alignments laid out as
``triton_moe_align`` lays them out (every expert's run padded to whole 128-row blocks, padding = num_pairs,
-1 past the used blocks), against the kinds derived from each expert's row count."""

from __future__ import annotations

import pytest
import torch

from dayzero.kernels.gluon_moe_fold_plan import ABSORBED, BLOCK, FOLD, FULL, HALF, fold_counts, fold_kinds


def aligned(counts: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(sorted_ids, block_expert, P) for experts with these row counts (pairs in a shuffled order per run)."""
    g = torch.Generator().manual_seed(seed)
    P = sum(counts)
    mpad = -(-(P + len(counts) * (BLOCK - 1)) // BLOCK) * BLOCK
    sorted_ids = torch.full((mpad, ), -7, dtype=torch.int32)               # never-written slots: garbage
    block_expert = torch.full((mpad // BLOCK, ), -1, dtype=torch.int32)
    perm = torch.randperm(P, generator=g).to(torch.int32)
    row = pair = 0
    for e, c in enumerate(counts):
        blocks = -(-c // BLOCK)
        sorted_ids[row:row + c] = perm[pair:pair + c]
        sorted_ids[row + c:row + blocks * BLOCK] = P
        block_expert[row // BLOCK:row // BLOCK + blocks] = e
        row += blocks * BLOCK
        pair += c
    return sorted_ids, block_expert, P


def expected(counts: list[int], tail: int) -> list[int]:
    kinds = []
    for c in counts:
        blocks = -(-c // BLOCK)
        ks = [FULL if c - b * BLOCK > BLOCK // 2 else HALF for b in range(blocks)]
        r = c % BLOCK
        if tail and blocks >= 2 and 1 <= r <= tail:
            ks[-2:] = [FOLD, ABSORBED]
        kinds += ks
    return kinds


CASES = [[129, 144, 145, 264, 16, 128, 100, 46], [256, 257, 272, 273, 1, 0, 64, 65, 383, 385],
         [0, 0, 300], [1000, 1024, 1040]]


@pytest.mark.parametrize("counts", CASES)
@pytest.mark.parametrize("tail", [0, 16, 32])
def test_fold_kinds_match_counts(counts, tail):
    sorted_ids, block_expert, P = aligned(counts, seed=len(counts) + tail)
    kinds = fold_kinds(sorted_ids, block_expert, P, tail)
    assert kinds.tolist() == expected(counts, tail)
    c = fold_counts(sorted_ids, block_expert, P, tail)
    assert c.fold == c.absorbed and c.tiles == kinds.numel() - c.absorbed
    assert c.full + c.half + c.fold + c.absorbed == int((block_expert >= 0).sum())


def test_random_routing_counts():
    """A 120B-like random spread (256 +- 16 rows an expert): folding at 16 rows takes most tails."""
    g = torch.Generator().manual_seed(5)
    counts = torch.bincount(torch.randint(0, 128, (32768, ), generator=g), minlength=128).tolist()
    sorted_ids, block_expert, P = aligned(counts)
    none, f16, f32 = (fold_counts(sorted_ids, block_expert, P, t) for t in (0, 16, 32))
    tails = sum(1 for c in counts if c > BLOCK and 1 <= c % BLOCK <= BLOCK // 2)
    assert none.half == tails and none.fold == 0
    assert f16.fold == sum(1 for c in counts if c > BLOCK and 1 <= c % BLOCK <= 16)
    assert f16.half == tails - f16.fold and f32.fold >= f16.fold
    assert f16.tiles < none.tiles


def test_bad_inputs():
    sorted_ids, block_expert, P = aligned([130])
    with pytest.raises(ValueError):
        fold_kinds(sorted_ids[:-1], block_expert, P, 16)
    with pytest.raises(ValueError):
        fold_kinds(sorted_ids, block_expert, P, 65)
