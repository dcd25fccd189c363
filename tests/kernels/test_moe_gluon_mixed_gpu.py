"""Gluon MoE GEMM with folded tails (``GluonConfig.fold``, ``gluon_moe_fold``) vs the torch FP8 reference and vs
the shipped 128-row configuration ``BM128``.

Every case: the bounds of tests/kernels/test_moe_gluon_gpu.py (``check``: fresh random inputs, the allocator's
free memory NaN-poisoned, every routed pair's y row written, the Gluon kernels ran); the y rows of every pair
outside an expert's folded tail bitwise equal to BM128's (the same instructions compute them), the tail pairs'
rows close to BM128's (a swapped wgmma computes them); the tile kinds written on the GPU
(``gluon_moe_fold_info``) equal the torch plan's, and the alignment holds the kinds the case is for
(``gluon_moe_fold_plan.fold_counts``), so a case cannot pass without exercising the fold tiles.
Routing: exact per-expert counts (tails of 1 to 100 rows after 1, 2 or 7 full blocks, single-block experts,
an exact 128), random (E = 32: 256 +- 16 rows an expert, as the 120B bench), skewed, balanced (no tails), and
H = 208 / I = 336 (N tails inside a tile: the second weight block past N).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpu_util import DEV, rel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LIMIT = 7.0
# the candidate (consumer 240 / producer 24 registers: no spills in the K loops at sm_90), the same folding any
# tail that fits (fold_max 127: also tails of 65-127 rows, which BM128 runs as padded full tiles; the same kernel),
# and the static walk without wsplit / fast_epi (the other producer and epilogue branches). The shipped register
# split (bench variant gluon128_fold16_r232) runs the same code: not repeated here (a kernel build each).
CFGS = {"fold16": dict(fold=16, consumer_regs=240, producer_regs=24),
        "fold16_all": dict(fold=16, fold_max=127, consumer_regs=240, producer_regs=24),
        "fold16_static": dict(fold=16, sched=0, wsplit=False, fast_epi=False, consumer_regs=240, producer_regs=24)}


def _cfg(name):
    pytest.importorskip("triton")
    from dayzero.kernels.gluon_moe_gemm_run import BM128, BM128_FOLD16

    assert BM128_FOLD16 == dataclasses.replace(BM128, **CFGS["fold16"])        # the named candidate
    return dataclasses.replace(BM128, **CFGS[name])


def ids_with_counts(counts: list[int], k: int, seed: int) -> torch.Tensor:
    """[T, k] expert ids with exactly counts[e] pairs routed to expert e (shuffled; sum divisible by k)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    flat = torch.cat([torch.full((c, ), e, dtype=torch.int64) for e, c in enumerate(counts)])
    return flat[torch.randperm(flat.numel(), generator=g)].view(-1, k)


def _tail_pairs(run, cfg) -> torch.Tensor:
    """[P] bool: pairs sitting in a block that the fold tiles absorb (for this run's alignment)."""
    from dayzero.kernels.gluon_moe_fold_plan import ABSORBED, BLOCK, fold_plan

    al = run.al
    kind, _ = fold_plan(al.sorted_ids, al.block_expert, al.num_pairs, cfg.fold, cfg.fold_max)
    rows = al.sorted_ids.view(-1, BLOCK)[:kind.numel()].cpu()[kind == ABSORBED].reshape(-1).long()
    mask = torch.zeros(al.num_pairs, dtype=torch.bool)
    mask[rows[rows < al.num_pairs]] = True
    return mask.to(run.y.device)


def fold_case(x, w, ids, q, d, cfg, min_fold: int = 1):
    """``check`` bounds; BM128 bitwise outside the tails, close on them; returns the fold run's FoldCounts."""
    from dayzero.kernels.gluon_moe_fold_plan import ABSORBED, FOLD, HALF, fold_counts, fold_plan
    from dayzero.kernels.gluon_moe_gemm_run import BM128, GluonMoeRun
    from test_moe_gluon_gpu import check

    check(x, w, ids, q, d, cfg)
    runs = []
    for c in (cfg, BM128):
        run = GluonMoeRun(x, w, ids, q, LIMIT, c)
        run.y.fill_(float("nan"))
        run()
        runs.append(run)
    fold, ship = runs
    counts = fold_counts(fold.al.sorted_ids, fold.al.block_expert, fold.al.num_pairs, cfg.fold, cfg.fold_max)
    kind, rows = fold_plan(fold.al.sorted_ids, fold.al.block_expert, fold.al.num_pairs, cfg.fold, cfg.fold_max)
    want = torch.where(kind == FOLD, rows * 4 + 1, torch.where(kind == ABSORBED, 2, torch.where(kind == HALF, 3, 0)))
    assert fold.fold_info[:kind.numel()].long().cpu().tolist() == want.tolist(), "GPU tile kinds != the torch plan"
    assert counts.fold >= min_fold and counts.absorbed <= counts.fold, counts
    tails = _tail_pairs(fold, cfg) | _tail_pairs(ship, cfg)
    local = (ids.reshape(-1) >= fold.offset) & (ids.reshape(-1) < fold.offset + fold.E)
    same = local.to(tails.device) & ~tails
    assert torch.equal(fold.y[same], ship.y[same]), "rows outside the folded tails differ from BM128"
    if bool((local.to(tails.device) & tails).any()):
        t = local.to(tails.device) & tails
        assert torch.isfinite(fold.y[t]).all()
        assert rel(fold.y[t], ship.y[t]) <= 1e-2, rel(fold.y[t], ship.y[t])
    return counts


@pytest.mark.parametrize("name", list(CFGS))
def test_fold_exact_counts(name):
    """Tails of 1, 16 (folded), 17 (a half tile: past 16 x 1 full block), 8 after two full blocks (one fold
    tile), 32 after two (two fold tiles), 100 after seven (a padded full tile; with fold_max 127 seven fold
    tiles of 16 rows); single-block experts of 16 and 46 rows (half tiles), an exact 128, 100 rows (padded)."""
    from test_moe_gpu import make_experts, route

    cfg = _cfg(name)
    counts = [129, 144, 145, 264, 16, 128, 100, 46, 288, 996]
    ids = ids_with_counts(counts, 4, seed=1).to(DEV)
    q, d = make_experts(len(counts), 2880, 2880, seed=2)
    x, w, _ = route(ids.shape[0], len(counts), 4, 2880, seed=3)
    c = fold_case(x, w, ids, q, d, cfg, min_fold=5)
    want = (12, 5, 3) if cfg.fold_max == 127 else (5, 4, 3)     # folds 1 + 1 + 1 + 2 (+ 7); half: experts 2, 4, 7
    assert (c.fold, c.absorbed, c.half) == want, c


@pytest.mark.parametrize("name", list(CFGS))
def test_fold_random_routing(name):
    """E = 32, 2048 tokens x top-4: 256 +- 16 rows an expert (the 120B bench's spread): many folds."""
    from test_moe_gpu import make_experts, route

    cfg = _cfg(name)
    q, d = make_experts(32, 2880, 2880, seed=11)
    x, w, ids = route(2048, 32, 4, 2880, seed=12)
    fold_case(x, w, ids, q, d, cfg, min_fold=4)


def test_fold_odd_shapes_skewed_balanced():
    """H = 208 / I = 336 with folds (a weight block past N in the last N tile of both GEMMs), skewed routing
    (expert 0 takes every token), balanced routing (no tails: the whole output bitwise BM128's), and an
    expert-parallel slice."""
    from dayzero.kernels.gluon_moe_gemm_run import BM128, fused_moe_gluon
    from test_moe_gluon_gpu import check
    from test_moe_gpu import make_experts, route, skewed_ids

    cfg = _cfg("fold16")
    ids = ids_with_counts([130, 140, 200, 260, 50, 20], 2, seed=21).to(DEV)
    q, d = make_experts(6, 208, 336, seed=22)
    x, w, _ = route(ids.shape[0], 6, 2, 208, seed=23)
    assert fold_case(x, w, ids, q, d, cfg, min_fold=3).fold == 3
    q, d = make_experts(32, 2880, 2880, seed=24)
    x, w, _ = route(1500, 32, 4, 2880, seed=25)
    fold_case(x, w, skewed_ids(1500, 4).to(DEV), q, d, cfg, min_fold=0)
    x, w, _ = route(1024, 32, 4, 2880, seed=26)
    ids = (torch.arange(1024 * 4, device=DEV) % 32).view(1024, 4)            # 128 rows an expert
    assert torch.equal(check(x, w, ids, q, d, cfg), fused_moe_gluon(x, w, ids, q, LIMIT, BM128))
    q, d = make_experts(8, 2880, 2880, seed=27, offset=8)
    x, w, ids = route(1200, 16, 4, 2880, seed=28)                            # experts 8-15 of 16: ~300 rows each
    fold_case(x, w, ids, q, d, cfg, min_fold=0)


def test_fold_graph_replay():
    """The fold configuration captured in a CUDA graph and replayed on new routing: eager's output (up to the
    tail rows: which pairs land in a tail follows the align step's atomics, and a swapped wgmma computes them)."""
    from dayzero.kernels.gluon_moe_gemm_run import GluonMoeRun
    from test_moe_gpu import make_experts, route

    cfg = _cfg("fold16")
    q, _ = make_experts(32, 2880, 2880, seed=31)
    x, w, ids = route(2048, 32, 4, 2880, seed=32)
    run = GluonMoeRun(x, w, ids, q, LIMIT, cfg)
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    x2, w2, ids2 = route(2048, 32, 4, 2880, seed=33)
    eager = GluonMoeRun(x2, w2, ids2, q, LIMIT, cfg)()
    run.x.copy_(x2)
    run.weights.copy_(w2.reshape(run.weights.shape))
    run.ids.copy_(ids2.reshape(run.ids.shape))
    g.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(run.out).all() and rel(run.out, eager) <= 1e-3, rel(run.out, eager)


def test_fold_option_errors():
    """fold needs 128-row tiles, half 0, no zpad, 16-row tail slices (32: over the shared memory limit),
    fold_max in [1, 127]: refused before any GEMM launch."""
    from dayzero.kernels.gluon_moe_gemm_run import BM64, BM128, fused_moe_gluon
    from test_moe_gpu import make_experts, route

    _cfg("fold16")
    q, _ = make_experts(8, 2880, 2880, seed=41)
    x, w, ids = route(256, 8, 4, 2880, seed=42)
    for cfg in (dataclasses.replace(BM64, fold=16), dataclasses.replace(BM128, fold=16, half=2),
                dataclasses.replace(BM128, fold=16, zpad=True), dataclasses.replace(BM128, fold=24),
                dataclasses.replace(BM128, fold=32), dataclasses.replace(BM128, fold=16, fold_max=128)):
        with pytest.raises(ValueError):
            fused_moe_gluon(x, w, ids, q, LIMIT, cfg)
