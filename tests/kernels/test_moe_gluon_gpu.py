"""Gluon warp-specialised MoE GEMMs (``gluon_moe_gemm``) vs the torch reference ``moe_experts``.

Same bounds as tests/kernels/test_moe_gpu.py for the FP8 large path (fresh random inputs, the
allocator's free memory NaN-poisoned before each call, ``e_ref`` = the reference's own FP8 emulation
error vs the dequantized fp32 experts):
  |gluon - exact| <= 1.2 * e_ref + 2e-3 and |gluon - ref| <= 0.25 * e_ref + 5e-3.
Every case also checks that the Gluon kernels ran (not the Triton fallback) and that every pair's
row of y was written (y NaN-filled first). The shape cases run both kernels: 64-row tiles
(``gluon_moe_gemm``) and 128-row tiles (``gluon_moe_gemm128``: full tiles where the consumers split M,
half tiles where an expert's run ends in the first 64 rows; the cases below have both kinds).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dayzero.kernels import torch_ops as ref
from gpu_util import DEV, poison, rel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LIMIT = 7.0


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def check(x, w, ids, q, d, cfg=None):
    pytest.importorskip("triton")
    if not _hopper():
        pytest.skip("the Gluon MoE GEMM is written for sm_90 (wgmma)")
    from dayzero.kernels.gluon_moe_gemm_run import DEFAULT, GluonMoeRun

    T, H = x.shape
    ref_out = ref.moe_experts(x, w, ids, q, LIMIT)
    exact = ref.moe_experts(x, w, ids, d, LIMIT)
    poison()
    run = GluonMoeRun(x, w, ids, q, LIMIT, cfg or DEFAULT)
    run.y.fill_(float("nan"))
    out = run()
    assert run.gluon_ok(), "operands fell back to the Triton GEMMs"
    local = (ids.reshape(-1) >= run.offset) & (ids.reshape(-1) < run.offset + run.E)
    assert torch.isfinite(run.y[local]).all(), "a routed pair's row of y was not written"
    assert out.shape == (T, H) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all(), "unwritten (NaN) or non-finite output elements"
    e_ref = rel(ref_out, exact)
    assert rel(out, exact) <= 1.2 * e_ref + 2e-3, (rel(out, exact), e_ref)
    assert rel(out, ref_out) <= 0.25 * e_ref + 5e-3, (rel(out, ref_out), e_ref)
    return out


def tile_cfg(bm):
    """The kernel of one parametrization: 64-row tiles (default config) or 128-row tiles."""
    from dayzero.kernels.gluon_moe_gemm_run import DEFAULT

    return DEFAULT if bm == 64 else dataclasses.replace(DEFAULT, bm=128, group_m=8)


BMS = pytest.mark.parametrize("bm", [64, 128])


def run_case(T, E, H, I, k, seed, offset=0, E_global=None, cfg=None):
    from test_moe_gpu import make_experts, route

    q, d = make_experts(E, H, I, seed, offset)
    x, w, ids = route(T, E_global or E, k, H, seed + 1)
    return check(x, w, ids, q, d, cfg)


@BMS
@pytest.mark.parametrize("T", [300, 2048])
def test_gluon_moe_20b(T, bm):
    run_case(T, 32, 2880, 2880, 4, seed=100 + T, cfg=tile_cfg(bm))


@BMS
@pytest.mark.parametrize("T", [1024, 4096])
def test_gluon_moe_120b(T, bm):
    run_case(T, 128, 2880, 2880, 4, seed=7 + T, cfg=tile_cfg(bm))


@BMS
def test_gluon_moe_odd_shapes(bm):
    # H = 208, I = 336: N and K tails inside one tile (a weight block partly or wholly past N)
    run_case(37, 6, 208, 336, 2, seed=3, cfg=tile_cfg(bm))
    run_case(300, 6, 208, 336, 2, seed=4, cfg=tile_cfg(bm))                # full 128-row tiles too


@BMS
def test_gluon_moe_expert_parallel_slice(bm):
    run_case(200, 8, 2880, 2880, 4, seed=5, offset=8, E_global=32, cfg=tile_cfg(bm))


@pytest.mark.parametrize("bm,stages,group_m", [(64, 5, 8), (128, 3, 4)])
def test_gluon_moe_configs(bm, stages, group_m):
    from dayzero.kernels.gluon_moe_gemm_run import GluonConfig

    run_case(700, 32, 2880, 2880, 4, seed=stages, cfg=GluonConfig(stages=stages, group_m=group_m, bm=bm))


@BMS
def test_gluon_moe_skewed_routing(bm):
    """Ragged groups: expert 0 takes every token, a few experts the rest, most experts none."""
    from test_moe_gpu import make_experts, route, skewed_ids

    T, E, k, H = 1500, 32, 4, 2880
    q, d = make_experts(E, H, H, seed=31)
    x, w, _ = route(T, E, k, H, seed=32)
    check(x, w, skewed_ids(T, k).to(DEV), q, d, tile_cfg(bm))


def test_gluon_moe_half_tiles_one_warpgroup():
    """128-row tiles with HALF 1 (a half tile on warpgroup 0 alone): all half tiles, and a mix."""
    from dayzero.kernels.gluon_moe_gemm_run import BM128

    cfg = dataclasses.replace(BM128, half=1)
    run_case(300, 32, 2880, 2880, 4, seed=41, cfg=cfg)
    run_case(2048, 32, 2880, 2880, 4, seed=42, cfg=cfg)


def test_gluon_moe_half_tiles_a_rows():
    """128-row tiles, HALF 2 (a half tile loads only A's 64 real rows): all half tiles, a mix, odd
    shapes, skewed routing."""
    from dayzero.kernels.gluon_moe_gemm_run import BM128
    from test_moe_gpu import make_experts, route, skewed_ids

    half = 2
    cfg = dataclasses.replace(BM128, half=half)
    run_case(300, 32, 2880, 2880, 4, seed=61 + half, cfg=cfg)
    run_case(2048, 32, 2880, 2880, 4, seed=62 + half, cfg=cfg)
    run_case(37, 6, 208, 336, 2, seed=63 + half, cfg=cfg)
    q, d = make_experts(32, 2880, 2880, seed=64 + half)
    x, w, _ = route(1500, 32, 4, 2880, seed=65 + half)
    check(x, w, skewed_ids(1500, 4).to(DEV), q, d, cfg)


def test_gluon_moe_fused_glue():
    """GluonConfig.glue: align and quantization in three launches (align_quant_pairs; padding rows of A
    unwritten, NaN-poisoned by check)."""
    from dayzero.kernels.gluon_moe_gemm_run import BM64, BM128

    run_case(2048, 32, 2880, 2880, 4, seed=71, cfg=dataclasses.replace(BM128, glue=True))
    run_case(700, 32, 2880, 2880, 4, seed=72, cfg=dataclasses.replace(BM64, glue=True))
    run_case(200, 8, 2880, 2880, 4, seed=73, offset=8, E_global=32, cfg=dataclasses.replace(BM64, glue=True))


@pytest.mark.parametrize("bm", [64, 128])
def test_align_quant_pairs_matches_two_step_glue(bm):
    """align_quant_pairs == align_pairs + quantize_gathered_rows: the same M blocks, padding slots and,
    for every routed pair, bitwise the same quantized row and scales (slots inside a run may differ)."""
    pytest.importorskip("triton")
    from dayzero.kernels.triton_linear import quantize_gathered_rows
    from dayzero.kernels.triton_moe_align import align_pairs, align_quant_pairs

    for T, E, k, offset, E_glob in ((1000, 128, 4, 0, 128), (333, 8, 4, 8, 32), (3, 32, 4, 0, 32)):
        g = torch.Generator(device=DEV).manual_seed(T + bm)
        x = (torch.randn(T, 2880, device=DEV, generator=g) * 2).bfloat16()
        ids = torch.rand(T, E_glob, device=DEV, generator=g).topk(k, dim=1).indices
        al0 = align_pairs(ids, E, bm, offset)
        q0, s0 = quantize_gathered_rows(x, al0.sorted_ids, al0.block_expert, al0.num_pairs, k, bm)
        poison()
        al1, q1, s1 = align_quant_pairs(x, ids, E, bm, offset)
        P = T * k
        assert torch.equal(al0.block_expert, al1.block_expert)
        used = (al0.block_expert >= 0).repeat_interleave(bm)
        assert torch.equal((al0.sorted_ids == P) & used, (al1.sorted_ids == P) & used)
        rows = []
        for al in (al0, al1):
            real = used & (al.sorted_ids < P)
            r = torch.full((P,), -1, dtype=torch.long, device=DEV)
            r[al.sorted_ids[real].long()] = torch.nonzero(real).flatten()
            rows.append(r)
        assert torch.equal(rows[0] >= 0, rows[1] >= 0)
        m = rows[0] >= 0
        assert torch.equal(q0[rows[0][m]].view(torch.uint8), q1[rows[1][m]].view(torch.uint8))
        assert torch.equal(s0[:, rows[0][m]], s1[:, rows[1][m]])


def test_registered_op_tile_rows_by_load(monkeypatch):
    """The registered op takes 128-row tiles from BM128_MIN_ROWS_PER_EXPERT routed rows an expert on
    average (64-row below); DAYZERO_MOE_GLUON_BM forces either; outputs equal the configuration's own run."""
    pytest.importorskip("triton")
    if not _hopper():
        pytest.skip("the Gluon MoE GEMM is written for sm_90 (wgmma)")
    from dayzero.kernels.gluon_moe_gemm_run import BM64, BM128, BM128_MIN_ROWS_PER_EXPERT, config_for, fused_moe_gluon
    from dayzero.kernels.registry import get_ops
    from test_moe_gpu import make_experts, route

    monkeypatch.delenv("DAYZERO_MOE_GLUON_BM", raising=False)
    E = 8
    T = BM128_MIN_ROWS_PER_EXPERT * E // 4                                  # the threshold's rows an expert
    assert config_for(T * 4, E) == BM128 and config_for(T * 4 - 4, E) == BM64
    q, d = make_experts(E, 2880, 2880, seed=51)
    x, w, ids = route(T, E, 4, 2880, seed=52)
    out = check(x, w, ids, q, d, BM128)
    assert torch.equal(get_ops("triton").moe_experts(x, w, ids, q, LIMIT), out)
    monkeypatch.setenv("DAYZERO_MOE_GLUON_BM", "64")
    assert config_for(T * 4, E) == BM64
    assert torch.equal(get_ops("triton").moe_experts(x, w, ids, q, LIMIT), fused_moe_gluon(x, w, ids, q, LIMIT, BM64))
    monkeypatch.setenv("DAYZERO_MOE_GLUON_BM", "96")
    with pytest.raises(ValueError):
        config_for(T * 4, E)


def test_registered_op_takes_gluon_for_prefill(monkeypatch):
    """The triton backend's moe_experts runs the Gluon GEMMs for a large-M call on sm_90 (and the Triton
    ones with DAYZERO_MOE_GLUON=0); both outputs within the FP8 bounds of the reference."""
    pytest.importorskip("triton")
    if not _hopper():
        pytest.skip("the Gluon MoE GEMM is written for sm_90 (wgmma)")
    from dayzero.kernels import triton_moe
    from dayzero.kernels.gluon_moe_gemm_run import config_for, fused_moe_gluon
    from dayzero.kernels.registry import get_ops
    from test_moe_gpu import make_experts, route

    q, d = make_experts(32, 2880, 2880, seed=77)
    x, w, ids = route(1500, 32, 4, 2880, seed=78)
    assert triton_moe.gluon_prefill(x, ids, 32) and not triton_moe.gluon_prefill(x[:2], ids[:2], 32)
    op = get_ops("triton").moe_experts
    ref_out, exact = ref.moe_experts(x, w, ids, q, LIMIT), ref.moe_experts(x, w, ids, d, LIMIT)
    e_ref = rel(ref_out, exact)
    out = op(x, w, ids, q, LIMIT)
    cfg = config_for(ids.numel(), 32)                                      # DAYZERO_MOE_GLUON_BM or the default
    assert torch.equal(out, fused_moe_gluon(x, w, ids, q, LIMIT, cfg))       # deterministic, same path
    monkeypatch.setenv("DAYZERO_MOE_GLUON", "0")
    assert not triton_moe.gluon_prefill(x, ids, 32)
    out_triton = op(x, w, ids, q, LIMIT)
    assert torch.equal(out_triton, triton_moe.fused_moe(x, w, ids, q, LIMIT))
    for o in (out, out_triton):
        assert torch.isfinite(o).all()
        assert rel(o, ref_out) <= 0.25 * e_ref + 5e-3, (rel(o, ref_out), e_ref)


def _runs_of(block_expert: torch.Tensor) -> torch.Tensor:
    """[used, 2]: for each used block, the first block and the length of its expert's run (from block_expert)."""
    be = block_expert.cpu()
    used = int((be >= 0).sum())
    _, counts = torch.unique_consecutive(be[:used], return_counts=True)
    first = torch.cumsum(counts, 0) - counts
    return torch.stack([first.repeat_interleave(counts), counts.repeat_interleave(counts)], 1).to(torch.int32)


@pytest.mark.parametrize("bm", [64, 128])
def test_align_block_span(bm):
    """span=True (the Gluon walk by expert): every used block's (first block, blocks) of its expert's run,
    from both align paths, equals the runs read off block_expert; the alignment itself is unchanged."""
    pytest.importorskip("triton")
    from dayzero.kernels.triton_moe_align import align_pairs, align_quant_pairs
    from test_moe_gpu import skewed_ids

    cases = [(2000, 8, 0, 8), (1500, 16, 0, 16), (1000, 128, 0, 128), (333, 8, 8, 32), (3, 32, 0, 32)]
    for T, E, offset, E_glob in cases:
        g = torch.Generator(device=DEV).manual_seed(T + bm)
        ids = torch.rand(T, E_glob, device=DEV, generator=g).topk(4, dim=1).indices
        x = torch.randn(T, 256, device=DEV, generator=g).bfloat16()
        for al in (align_pairs(ids, E, bm, offset, span=True), align_quant_pairs(x, ids, E, bm, offset, span=True)[0]):
            want = _runs_of(al.block_expert)
            assert torch.equal(al.block_span[:want.shape[0]].cpu(), want), (T, E, bm)
        assert torch.equal(align_pairs(ids, E, bm, offset).block_expert, al.block_expert)
    al = align_pairs(skewed_ids(1500, 4).to(DEV), 32, bm, span=True)                 # one long run, empty experts
    assert torch.equal(al.block_span[:int((al.block_expert >= 0).sum())].cpu(), _runs_of(al.block_expert))


# (T, E, H, I, top-k, seed, EP offset, global experts): 20B expert count (8-9 blocks an expert), 64 experts of
# 1-3 blocks (the 120B rows an expert at half its expert memory: six pytest workers building 120B experts at
# once ran out of GPU memory in Gluon run 7; at H = I = 1024 the FP8 numerics sit just outside check's bound
# for every configuration alike, run 8), odd shapes, an EP slice
SHAPE_CASES = ((2048, 32, 2880, 2880, 4, 81, 0, 32), (2048, 64, 2880, 2880, 4, 82, 0, 64),
               (300, 6, 208, 336, 2, 83, 0, 6), (200, 8, 2880, 2880, 4, 84, 8, 32))
WALK_CFGS = {"bm64": dict(bm=64, group_m=16), "bm128": dict(bm=128, group_m=8),
             "bm128_half2": dict(bm=128, group_m=8, half=2), "bm128_g16_glue": dict(bm=128, group_m=16, glue=True)}


@pytest.mark.parametrize("name", list(WALK_CFGS))
def test_gluon_moe_walk_by_expert(name):
    """GluonConfig.walk = 1 (groups inside each expert's run of blocks): within the FP8 bounds and bitwise
    equal to the same configuration's walk 0 (the walk only reorders tiles), on 20B / 120B expert counts,
    odd shapes, an EP slice and skewed routing (one expert's run of ~47 blocks, many empty experts)."""
    from dayzero.kernels.gluon_moe_gemm_run import GluonConfig, fused_moe_gluon
    from test_moe_gpu import make_experts, route, skewed_ids

    cfg = GluonConfig(walk=1, **WALK_CFGS[name])
    cfg0 = dataclasses.replace(cfg, walk=0)
    for T, E, H, I, k, seed, offset, E_glob in SHAPE_CASES:
        q, d = make_experts(E, H, I, seed, offset)
        x, w, ids = route(T, E_glob, k, H, seed + 1)
        out = check(x, w, ids, q, d, cfg)
        assert torch.equal(out, fused_moe_gluon(x, w, ids, q, LIMIT, cfg0)), (name, T, E)
    q, d = make_experts(32, 2880, 2880, seed=85)
    x, w, _ = route(1500, 32, 4, 2880, seed=86)
    ids = skewed_ids(1500, 4).to(DEV)
    assert torch.equal(check(x, w, ids, q, d, cfg), fused_moe_gluon(x, w, ids, q, LIMIT, cfg0))


SCHED_CFGS = {"bm128": dict(bm=128, group_m=8), "bm128_half2_glue": dict(bm=128, group_m=8, half=2, glue=True),
              "bm128_walk_half1": dict(bm=128, group_m=8, walk=1, half=1)}


@pytest.mark.parametrize("name", list(SCHED_CFGS))
def test_gluon_moe_dynamic_schedule(name):
    """GluonConfig.sched = 1 (tiles handed out by a global counter, gluon_moe_sched): within the FP8 bounds
    and bitwise equal to the static schedule of the same configuration, twice in a row (the counter is
    zeroed per launch), on the shape cases and skewed routing; fewer used tiles than CTAs (T = 37)."""
    from dayzero.kernels.gluon_moe_gemm_run import GluonConfig, GluonMoeRun, fused_moe_gluon
    from test_moe_gpu import make_experts, route, skewed_ids

    cfg = GluonConfig(sched=1, **SCHED_CFGS[name])
    cfg0 = dataclasses.replace(cfg, sched=0)
    for T, E, H, I, k, seed, offset, E_glob in SHAPE_CASES + ((37, 6, 208, 336, 2, 87, 0, 6), ):
        q, d = make_experts(E, H, I, seed, offset)
        x, w, ids = route(T, E_glob, k, H, seed + 1)
        out = check(x, w, ids, q, d, cfg)
        run = GluonMoeRun(x, w, ids, q, LIMIT, cfg)
        assert torch.equal(run(), out) and torch.equal(run(), out), (name, T, E)      # same run object again
        assert torch.equal(out, fused_moe_gluon(x, w, ids, q, LIMIT, cfg0)), (name, T, E)
    q, d = make_experts(32, 2880, 2880, seed=88)
    x, w, _ = route(1500, 32, 4, 2880, seed=89)
    ids = skewed_ids(1500, 4).to(DEV)
    assert torch.equal(check(x, w, ids, q, d, cfg), fused_moe_gluon(x, w, ids, q, LIMIT, cfg0))


# Gluon run 9 (session 6) options on the session-5 128-row configuration: the gate_up epilogue without the range
# guards of exp / division (fast_epi), W as one TMA box per weight block with the box past N skipped (wsplit),
# the fused glue with 4 pairs a program (glue_rows), HALF 2 with all three, and all three with zero padding rows
RUN9_CFGS = {"fast_epi": dict(fast_epi=True), "wsplit": dict(wsplit=True),
             "fast_wsplit_glue4": dict(fast_epi=True, wsplit=True, glue=True, glue_rows=4),
             "half2_fast_wsplit_glue4": dict(half=2, fast_epi=True, wsplit=True, glue=True, glue_rows=4),
             "fast_wsplit_glue4_zpad": dict(fast_epi=True, wsplit=True, glue=True, glue_rows=4, zpad=True)}


@pytest.mark.parametrize("name", list(RUN9_CFGS))
def test_gluon_moe_run9_options(name):
    """Each run-9 option within the FP8 bounds and bitwise equal to the session-5 128-row configuration
    (BM128_RUN8, none of them) on the shape cases (2880-wide shapes: the last gate_up / down N tile has no
    second weight block, so wsplit skips its box), skewed routing, and T = 37 (fewer tiles than CTAs)."""
    from dayzero.kernels.gluon_moe_gemm_run import BM128, BM128_RUN8, fused_moe_gluon
    from test_moe_gpu import make_experts, route, skewed_ids

    assert BM128 == dataclasses.replace(BM128_RUN8, **RUN9_CFGS["fast_wsplit_glue4"])      # the shipped options
    cfg = dataclasses.replace(BM128_RUN8, **RUN9_CFGS[name])
    for T, E, H, I, k, seed, offset, E_glob in SHAPE_CASES + ((37, 6, 208, 336, 2, 91, 0, 6), ):
        q, d = make_experts(E, H, I, seed, offset)
        x, w, ids = route(T, E_glob, k, H, seed + 1)
        out = check(x, w, ids, q, d, cfg)
        assert torch.equal(out, fused_moe_gluon(x, w, ids, q, LIMIT, BM128_RUN8)), (name, T, E)
    q, d = make_experts(32, 2880, 2880, seed=92)
    x, w, _ = route(1500, 32, 4, 2880, seed=93)
    ids = skewed_ids(1500, 4).to(DEV)
    assert torch.equal(check(x, w, ids, q, d, cfg), fused_moe_gluon(x, w, ids, q, LIMIT, BM128_RUN8))


def test_run9_option_errors():
    """Bad run-9 options are refused before any launch: glue_rows not a power of 2, fast_epi / wsplit on
    64-row tiles, wsplit with the HALF 3 diagnostic."""
    pytest.importorskip("triton")
    if not _hopper():
        pytest.skip("the Gluon MoE GEMM is written for sm_90 (wgmma)")
    from dayzero.kernels.gluon_moe_gemm_run import BM64, BM128, fused_moe_gluon
    from dayzero.kernels.triton_moe_align import align_quant_pairs
    from test_moe_gpu import make_experts, route

    q, _ = make_experts(8, 2880, 2880, seed=94)
    x, w, ids = route(256, 8, 4, 2880, seed=95)
    with pytest.raises(ValueError):
        align_quant_pairs(x, ids, 8, 128, rows_per_prog=3)
    for cfg in (dataclasses.replace(BM64, fast_epi=True), dataclasses.replace(BM64, wsplit=True),
                dataclasses.replace(BM64, zpad=True), dataclasses.replace(BM128, wsplit=True, half=3)):
        with pytest.raises(ValueError):
            fused_moe_gluon(x, w, ids, q, LIMIT, cfg)
