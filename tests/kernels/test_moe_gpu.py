"""Triton fused MoE (both paths) vs the torch reference ``moe_experts`` on real gpt-oss shapes.

Fresh random inputs per case; the allocator's free memory is NaN-poisoned before each call so an
unwritten row/column shows up. ``exact`` is the torch op on the dequantized (fp32) expert weights,
so ``e_ref = |ref - exact| / |exact|`` is the reference's own FP8 emulation error:
  * both paths: |triton - exact| <= 1.2 * e_ref + 2e-3;
  * the FP8 (prefill) path quantizes x and h 1x128 like the reference: |triton - ref| <= 0.25 * e_ref + 5e-3.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dayzero.kernels import torch_ops as ref
from dayzero.kernels.types import ExpertWeights
from dayzero.weights import fp8
from gpu_util import DEV, poison, rel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LIMIT = 7.0


def make_experts(E: int, H: int, I: int, seed: int, offset: int = 0) -> tuple[ExpertWeights, ExpertWeights]:
    """(fp8 experts, the same experts dequantized to fp32) with gpt-oss-like magnitudes."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    experts = []
    for shape, std in (((E, 2 * I, H), 0.03), ((E, H, I), 0.02)):
        w = torch.randn(shape, device=DEV, generator=g) * std
        q, s = fp8.quantize_weight_block(w)
        del w
        experts.append((q, s))
    (gu, gus), (dn, dns) = experts
    gub = (torch.randn(E, 2 * I, device=DEV, generator=g) * 0.5).bfloat16()
    dnb = (torch.randn(E, H, device=DEV, generator=g) * 0.5).bfloat16()
    derived = {"expert_offset": offset}
    q = ExpertWeights(gate_up=gu, gate_up_bias=gub, down=dn, down_bias=dnb, gate_up_scale=gus, down_scale=dns,
                      derived=dict(derived))
    d = ExpertWeights(gate_up=fp8.dequantize_weight_block(gu, gus), gate_up_bias=gub,
                      down=fp8.dequantize_weight_block(dn, dns), down_bias=dnb, derived=dict(derived))
    return q, d


def route(T: int, E_global: int, k: int, H: int, seed: int):
    torch.manual_seed(seed)
    x = (torch.randn(T, H, device=DEV) * 1.5).bfloat16()
    logits = torch.randn(T, E_global, device=DEV).bfloat16()
    w, ids = ref.router_topk(logits, k)
    return x, w, ids


def run_case(T, E, H, I, k, small, seed, offset=0, E_global=None, tiles=None):
    q, d = make_experts(E, H, I, seed, offset)
    x, w, ids = route(T, E_global or E, k, H, seed + 1)
    return check(x, w, ids, q, d, small, tiles)


def check(x, w, ids, q, d, small, tiles=None):
    from dayzero.kernels.triton_moe import fused_moe

    T, H = x.shape
    ref_out = ref.moe_experts(x, w, ids, q, LIMIT)
    exact = ref.moe_experts(x, w, ids, d, LIMIT)
    poison()
    out = fused_moe(x, w, ids, q, LIMIT, small=small, tiles=tiles)
    assert out.shape == (T, H) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all(), "unwritten (NaN) or non-finite output elements"
    e_ref = rel(ref_out, exact)
    assert rel(out, exact) <= 1.2 * e_ref + 2e-3, (rel(out, exact), e_ref)
    if not small:
        assert rel(out, ref_out) <= 0.25 * e_ref + 5e-3, (rel(out, ref_out), e_ref)
    return out, ref_out


# gpt-oss-20b expert shapes (E=32, H=I=2880, top-4); both paths at decode and prefill sizes
@pytest.mark.parametrize("T", [1, 5, 64, 300, 2048])
@pytest.mark.parametrize("small", [True, False])
def test_moe_20b_shapes(T, small):
    run_case(T, 32, 2880, 2880, 4, small, seed=T + small)


@pytest.mark.parametrize("variant", ["gather_a_pointers", "tiny_tiles_small_path"])
def test_moe_tile_variants(variant):
    from dayzero.kernels.triton_moe import LARGE, TINY

    if variant == "gather_a_pointers":  # FP8 path reading x through the pointer gather instead of TMA
        run_case(300, 32, 2880, 2880, 4, False, seed=21, tiles=dataclasses.replace(LARGE, gather_quant=False))
    else:
        run_case(40, 32, 2880, 2880, 4, True, seed=22, tiles=TINY)


@pytest.mark.parametrize("T,k,E,bm,offset,E_global", [(7, 2, 6, 16, 0, 6), (300, 4, 32, 64, 0, 32),
                                                      (50, 4, 8, 16, 8, 32), (1, 4, 128, 16, 0, 128),
                                                      (5000, 4, 32, 64, 0, 32), (3000, 4, 128, 64, 64, 128)])
def test_align_pairs(T, k, E, bm, offset, E_global):
    from dayzero.kernels.triton_moe_align import align_pairs

    torch.manual_seed(T)
    ids = torch.stack([torch.randperm(E_global)[:k] for _ in range(T)]).to(DEV)
    al = align_pairs(ids, E, bm, offset)
    P = T * k
    local = (ids.reshape(-1) - offset).cpu()
    be, si = al.block_expert.cpu(), al.sorted_ids.cpu()
    n_used = int((be >= 0).sum())
    assert (be[:n_used] >= 0).all() and (be[n_used:] == -1).all() and (be[:n_used].diff() >= 0).all()
    rows = si[: n_used * bm].view(n_used, bm)
    real = rows < P
    assert torch.equal(local[rows[real].long()], be[:n_used, None].expand_as(rows)[real])  # right expert
    got = torch.sort(rows[real]).values
    want = torch.nonzero((local >= 0) & (local < E)).flatten().to(got.dtype)
    assert torch.equal(got, want)                                                      # each pair once
    assert int((rows == P).sum()) == n_used * bm - got.numel()                          # padding sentinels


@pytest.mark.parametrize("T,small", [(3, True), (64, True), (1024, False)])
def test_moe_120b_expert_count(T, small):
    run_case(T, 128, 2880, 2880, 4, small, seed=T)


@pytest.mark.parametrize("small", [True, False])
def test_moe_odd_shapes(small):
    # H, I not multiples of 128 nor of each other; top-2 of 6 experts
    run_case(37, 6, 208, 336, 2, small, seed=3)


@pytest.mark.parametrize("small", [True, False])
def test_moe_expert_parallel_slice(small):
    # this rank owns global experts [8, 16) of 32: routes elsewhere are skipped, as the reference
    run_case(200, 8, 2880, 2880, 4, small, seed=5, offset=8, E_global=32)


def test_moe_registered_op_picks_path():
    from dayzero.kernels.registry import get_ops

    ops = get_ops("triton")
    assert "moe_experts" not in ops.fallbacks and "router_topk" not in ops.fallbacks
    q, _ = make_experts(32, 2880, 2880, seed=9)
    for T in (2, 1500):
        x, w, ids = route(T, 32, 4, 2880, seed=T)
        out = ops.moe_experts(x, w, ids, q, LIMIT)
        assert rel(out, ref.moe_experts(x, w, ids, q, LIMIT)) < 0.05


def _large_variants() -> dict:
    """Large-M configurations besides the default (which every test above runs): the previous default
    (moe_gemm_kernel, also the fallback for operands TMA cannot take) and options of triton_moe_gemm_large."""
    from dayzero.kernels.triton_moe import LARGE, LARGE_V1

    r = dataclasses.replace
    return {"v1": LARGE_V1, "split2_persistent_flatten": r(LARGE, split_gate_up=2, persistent_gate_up=1),
            "pipe": r(LARGE, stages=2, stages_down=3, pipe_gate_up=True, pipe_down=True),
            "down_persistent2": r(LARGE, persistent_down=2)}


@pytest.mark.parametrize("variant", ["v1", "split2_persistent_flatten", "pipe", "down_persistent2"])
@pytest.mark.parametrize("T,E", [(300, 32), (1024, 128)])
def test_moe_large_kernel(variant, T, E):
    run_case(T, E, 2880, 2880, 4, False, seed=T + E, tiles=_large_variants()[variant])


@pytest.mark.parametrize("I,large", [(336, True), (200, False)])
def test_moe_large_kernel_default_path(I, large):
    """The default runs triton_moe_gemm_large where TMA can take the operands (I % 16 == 0) and falls
    back to moe_gemm_kernel where it cannot (h rows of 200 bytes); both match the reference (odd H)."""
    from dayzero.kernels.triton_moe import MoeRun

    H, E = 208, 6
    q, d = make_experts(E, H, I, seed=41)
    x, w, ids = route(37, E, 2, H, seed=42)
    run = MoeRun(x, w, ids, q, LIMIT, small=False)
    run.align()
    run.quant()
    assert run._large() is large
    check(x, w, ids, q, d, small=False)



def skewed_ids(T: int, k: int, seed: int = 33) -> torch.Tensor:
    """[T, k] expert ids on the CPU: expert 0 takes every token, experts 1-3 the rest of the first half,
    4-6 with ragged counts in the second half, every other expert none."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.zeros(T, k, dtype=torch.int64)
    ids[:, 1:] = torch.stack([torch.randperm(3, generator=g)[: k - 1] + 1 for _ in range(T)])
    ids[T // 2:, 1] = 4 + torch.arange(T - T // 2) % 3
    return ids

@pytest.mark.parametrize("variant", ["default", "v1"])
def test_moe_large_kernel_skewed_routing(variant):
    """Ragged groups: expert 0 takes every token, experts 1-6 the rest, 25 of 32 experts get none."""
    T, E, k, H = 1500, 32, 4, 2880
    q, d = make_experts(E, H, H, seed=31)
    x, w, _ = route(T, E, k, H, seed=32)
    ids = skewed_ids(T, k)
    tiles = None if variant == "default" else _large_variants()[variant]
    check(x, w, ids.to(DEV), q, d, small=False, tiles=tiles)
