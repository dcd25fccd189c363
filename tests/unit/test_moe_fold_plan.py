"""Tile kinds of the folded-tail Gluon MoE GEMM (``gluon_moe_fold_plan``, torch only) on alignments laid out as
``triton_moe_align`` lays them out (every expert's run padded to whole 128-row blocks, padding = num_pairs,
-1 past the used blocks), against the kinds derived from each expert's row count; and the Triton launch that
writes them for the kernel (``gluon_moe_fold_info``) against the torch plan, in Triton's CPU interpreter (a
subprocess; skipped without triton)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dayzero.kernels.gluon_moe_fold_plan import ABSORBED, BLOCK, FOLD, FULL, HALF, fold_counts, fold_plan


def aligned(counts: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(sorted_ids, block_expert, P, block_span) for experts with these row counts (pairs shuffled)."""
    g = torch.Generator().manual_seed(seed)
    P = sum(counts)
    mpad = -(-(P + len(counts) * (BLOCK - 1)) // BLOCK) * BLOCK
    sorted_ids = torch.full((mpad, ), -7, dtype=torch.int32)               # never-written slots: garbage
    block_expert = torch.full((mpad // BLOCK, ), -1, dtype=torch.int32)
    span = torch.zeros((mpad // BLOCK, 2), dtype=torch.int32)
    perm = torch.randperm(P, generator=g).to(torch.int32)
    row = pair = 0
    for e, c in enumerate(counts):
        blocks = -(-c // BLOCK)
        sorted_ids[row:row + c] = perm[pair:pair + c]
        sorted_ids[row + c:row + blocks * BLOCK] = P
        block_expert[row // BLOCK:row // BLOCK + blocks] = e
        span[row // BLOCK:row // BLOCK + blocks] = torch.tensor([row // BLOCK, blocks], dtype=torch.int32)
        row += blocks * BLOCK
        pair += c
    return sorted_ids, block_expert, P, span


def expected(counts: list[int], tail: int, max_rows: int) -> tuple[list[int], list[int]]:
    """(kinds, tail rows) of the used blocks, from the counts alone."""
    kinds, rows, base = [], [], 0
    for c in counts:
        blocks = -(-c // BLOCK)
        F = blocks - 1
        r = c - F * BLOCK                                                   # rows of the last block
        folded = tail > 0 and F > 0 and r <= min(tail * F, max_rows)
        last = (base + F) * BLOCK
        for j in range(blocks):
            own = FULL if min(c - j * BLOCK, BLOCK) > BLOCK // 2 else HALF
            if folded and j < F and tail * j < r:
                kinds.append(FOLD)
                rows.append(last + tail * j)
            else:
                kinds.append(ABSORBED if folded and j == F else own)
                rows.append(0)
        base += blocks
    return kinds, rows


CASES = [[129, 144, 145, 264, 16, 128, 100, 46], [256, 257, 272, 273, 1, 0, 64, 65, 383, 385, 286],
         [0, 0, 300], [1000, 1024, 1040, 1151, 1152]]


@pytest.mark.parametrize("counts", CASES)
@pytest.mark.parametrize("tail,max_rows", [(0, 64), (16, 64), (16, 127), (32, 64), (16, 20)])
def test_fold_plan_matches_counts(counts, tail, max_rows):
    sorted_ids, block_expert, P, _ = aligned(counts, seed=len(counts) + tail)
    kinds, rows = fold_plan(sorted_ids, block_expert, P, tail, max_rows)
    assert (kinds.tolist(), rows.tolist()) == expected(counts, tail, max_rows)
    c = fold_counts(sorted_ids, block_expert, P, tail, max_rows)
    assert c.absorbed <= c.fold and c.tiles == kinds.numel() - c.absorbed
    assert c.full + c.half + c.fold + c.absorbed == int((block_expert >= 0).sum())


def test_random_routing_counts():
    """A 120B-like random spread (256 +- 16 rows an expert): a 16-row slice per full block takes almost every
    tail (two full blocks: up to 32 rows)."""
    g = torch.Generator().manual_seed(5)
    counts = torch.bincount(torch.randint(0, 128, (32768, ), generator=g), minlength=128).tolist()
    sorted_ids, block_expert, P, _ = aligned(counts)
    none, f16 = (fold_counts(sorted_ids, block_expert, P, t) for t in (0, 16))
    assert none.half == sum(1 for c in counts if c > BLOCK and 1 <= c % BLOCK <= BLOCK // 2) and none.fold == 0
    ok = [c % BLOCK for c in counts if c > BLOCK and 1 <= c % BLOCK <= min(16 * (c // BLOCK), 64)]
    assert f16.absorbed == len(ok) and f16.fold == sum(-(-r // 16) for r in ok)
    assert f16.half == none.half - f16.absorbed and f16.full + f16.fold == none.full   # absorbed: were half tiles


def test_bad_inputs():
    sorted_ids, block_expert, P, _ = aligned([130])
    with pytest.raises(ValueError):
        fold_plan(sorted_ids[:-1], block_expert, P, 16)
    with pytest.raises(ValueError):
        fold_plan(sorted_ids, block_expert, P, 65)
    with pytest.raises(ValueError):
        fold_plan(sorted_ids, block_expert, P, 16, 128)


INTERPRETED = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_moe_fold_plan import CASES, aligned
from dayzero.kernels.gluon_moe_fold_info import fold_info
from dayzero.kernels.gluon_moe_fold_plan import ABSORBED, FOLD, HALF, fold_plan
from dayzero.kernels.triton_moe_align import AlignedPairs
for counts in CASES + [[300] * 40]:
    for tail, max_rows in ((16, 64), (16, 127), (32, 64), (16, 20)):
        ids, be, P, span = aligned(counts, seed=tail + max_rows)
        al = AlignedPairs(sorted_ids=ids, block_expert=be, num_pairs=P, block_m=128, block_span=span)
        info = fold_info(al, tail, max_rows)
        kind, rows = fold_plan(ids, be, P, tail, max_rows)
        used = kind.numel()
        want = torch.where(kind == FOLD, rows * 4 + 1, torch.where(kind == ABSORBED, 2, torch.where(kind == HALF, 3, 0)))
        assert info[:used].long().tolist() == want.tolist(), (counts, tail)
        assert (info[used:] == 0).all()
print("ok")
"""


def test_fold_info_kernel_interpreted():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    code = INTERPRETED.format(tests=os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]
