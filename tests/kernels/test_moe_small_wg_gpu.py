"""Decode MoE on the FP8 tensor-core kernels (``triton_moe_small_wg``, tiles with ``SplitTiles.wg``) vs the torch
reference, through ``MoeSplit`` (the same checks as ``test_moe_small_gpu.py``, whose helpers build the experts
and inputs: fresh random inputs, NaN-poisoned allocator, |out - exact| <= 0.5 * e_ref + 2e-3 where e_ref is
the reference's own FP8 error). On the CPU: ``TRITON_INTERPRET=1 DAYZERO_KERNEL_TEST_DEVICE=cpu pytest
--noconftest tests/kernels/test_moe_small_wg_gpu.py`` (small odd shapes: K and N tails).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dayzero.kernels import torch_ops as ref
from gpu_util import DEV, poison, rel

pytest.importorskip("triton", reason="the Triton kernels need triton (GPU machines)")  # CI: skip at collection
from test_moe_small_gpu import (LIMIT, SHAPES, _tickets_zero, check, check_ep_slice,  # noqa: E402
                               check_graph_replay, experts, inputs)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEV == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _wg():
    from dayzero.kernels.triton_moe_small_wg import WG_VARIANTS

    return list(WG_VARIANTS)


def _tiles(name):
    from dayzero.kernels.triton_moe_small_split import VARIANTS

    return VARIANTS[name]


def _wg_cases():
    """(T, variant): every wg variant at T = 1 and 2, and the wg4 / wg8 ones at each larger T they take."""
    return [(T, v) for v in _wg() for T in (1, 2)] + \
        [(T, v) for v in _wg() for T in (4, 8) if _tiles(v).gemv_max_t >= T]


@pytest.mark.parametrize("T,variant", _wg_cases())
@pytest.mark.parametrize("name", ["20b", "120b"])
def test_wg_vs_reference(name, T, variant):
    from dayzero.kernels.triton_moe_small_split import MoeSplit

    tiles = _tiles(variant)
    x, w, ids = inputs(T, SHAPES[name][0], SHAPES[name][1], seed=40 + T)
    assert MoeSplit(x, w, ids, experts(name)[0], LIMIT, tiles).wg == (T <= tiles.gemv_max_t)
    check(name, T, seed=40 + T, tiles=tiles)
    assert _tickets_zero(experts(name)[0])   # every down ticket reset by its last user


def test_wg_one_term_token_is_coarser():
    # wg = 1: the token as one e4m3 term (the reference's own activation rounding): its error is of e_ref's
    # size, which is why the candidates carry the lo term (wg = 2)
    from dayzero.kernels.triton_moe_small_split import moe_split

    q, d = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(1, E, H, seed=51)
    exact = ref.moe_experts(x, w, ids, d, LIMIT)
    e_ref = rel(ref.moe_experts(x, w, ids, q, LIMIT), exact)
    one = rel(moe_split(x, w, ids, q, LIMIT, dataclasses.replace(_tiles("wg_d64"), wg=1)), exact)
    two = rel(moe_split(x, w, ids, q, LIMIT, _tiles("wg_d64")), exact)
    assert two < 0.5 * one and one <= 1.5 * e_ref + 2e-3, (one, two, e_ref)


@pytest.mark.parametrize("variant", ["wg_d64_s2_q", "wg128_d128_s4_qt"])
def test_wg_hq_h_near_its_bound(variant):
    # x 40x larger: most gate / up values clamp at the limit, |h| up to (limit + 1) * limit, where the fixed
    # e4m3 scale of the handed-over h (wg_hq) saturates if it is wrong
    from dayzero.kernels.triton_moe_small_split import MoeSplit

    q, d = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(1, E, H, seed=91)
    x = (x.float() * 40).bfloat16()
    exact = ref.moe_experts(x, w, ids, d, LIMIT)
    e_ref = rel(ref.moe_experts(x, w, ids, q, LIMIT), exact)
    run = MoeSplit(x, w, ids, q, LIMIT, _tiles(variant))
    out = run()
    h = run.h.view(torch.float8_e4m3fn)[:, :run.I].float() * ((LIMIT + 1) * LIMIT / 448)   # the hi rows
    assert h.abs().max() > 0.5 * (LIMIT + 1) * LIMIT     # the bound is reached, not only approached
    assert rel(out, exact) <= 0.5 * e_ref + 2e-3, (rel(out, exact), e_ref)


@pytest.mark.parametrize("variant", ["wg_d64", "wg128_d128_s4", "wg_d64_s2_q", "wg128_d128_s4_qt", "wg_d64_s2_qtp",
                                     "wgs8_d64_qtp", "wg8_d64_qtp_st2"])
@pytest.mark.parametrize("local_routes", [0, 2])
def test_wg_expert_parallel_slice(local_routes, variant):
    # this rank owns experts 8..15: routes elsewhere are skipped (the down tickets count local pairs x splits);
    # none local: one program per N tile writes zeros
    check_ep_slice(local_routes, _tiles(variant), seed=61 + local_routes)


@pytest.mark.parametrize("T", [2, 5, 8])
@pytest.mark.parametrize("repeated", [False, True])
def test_wgs_slots_match_pairs(T, repeated):
    # one program per expert slot (its <= 8 tokens as B columns) computes each token as the per-pair wg kernel
    # does (same per-token scales and products); repeated: every token on the same 4 experts (8 columns full)
    from dayzero.kernels.triton_moe_small_split import MoeSplit

    q, _ = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(T, E, H, seed=90 + T, repeated=repeated)
    poison()
    got = MoeSplit(x, w, ids, q, LIMIT, _tiles("wgs8_d64_qtp"))().clone()
    want = MoeSplit(x, w, ids, q, LIMIT, _tiles("wg8_d64_qtp"))()
    assert torch.isfinite(got).all()
    assert rel(got, want) <= 2e-3, rel(got, want)
    assert _tickets_zero(q)


@pytest.mark.parametrize("variant", ["wg2_d64_s2", "wg2_d64_s2_q", "wgs8_d64_s2_qtp"])
@pytest.mark.parametrize("repeated", [False, True])
def test_wg_two_tokens_per_pair(repeated, variant):
    # wg2: T = 2 on the wg kernels, one program per pair (repeated: both tokens on the same 4 experts)
    check("20b", 2, seed=71, tiles=_tiles(variant), repeated=repeated)
    assert _tickets_zero(experts("20b")[0])


@pytest.mark.parametrize("T,variant", [(1, "wg_d64_s2"), (1, "wg128_d128_s4"), (2, "wg2_d64_s2"),
                                       (1, "wg128_d128_s4_q"), (2, "wg2_d64_s2_q"), (1, "wg_d64_s2_qt"),
                                       (1, "wg_d64_s2_qtp"), (2, "wg2_d64_s2_p"), (4, "wg4_d64_s2_qtp"),
                                       (8, "wg8_d64_qtp"), (8, "wgs8_d64_qtp"), (4, "wgs8_d64_s2_qtp"),
                                       (2, "wg2_d64_s2_qtp_st3"), (4, "wg8_d64_qtp_st2")])
def test_wg_deterministic_and_graph_replay_equals_eager(T, variant):
    check_graph_replay(T, _tiles(variant), seed=81, wg=True)


def test_wg_rejects_bad_tiles():
    from dayzero.kernels.triton_moe_small_split import moe_split

    q, _ = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(1, E, H, seed=4)
    with pytest.raises(ValueError, match="wg tiles"):
        moe_split(x, w, ids, q, LIMIT, dataclasses.replace(_tiles("wg_d64"), bn_gate_up=32))
    with pytest.raises(ValueError, match="limit"):   # wg_hq's fixed h scale needs the SwiGLU clamp
        moe_split(x, w, ids, q, 1e4, _tiles("wg_d64_s2_q"))


@pytest.mark.parametrize("T,variant", [(1, "wg_d64_s2_qt"), (2, "wg2_d64_s2_qtp"), (4, "wg8_d64_qtp"),
                                       (2, "wg2_d64_s2_qtp_st3"), (4, "wg8_d64_qtp_st2")])
def test_wg_trace_stamps_and_same_output(T, variant):
    # TRACE (diagnostic, bench/moe/wg_trace.py): the traced kernels give the untraced output bit for bit, and every
    # program of a local pair stamps start <= end on a real SM; down's PDL-wait stamp lies between its own
    from dayzero.kernels.triton_moe_small_split import MoeSplit

    q, _ = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(T, E, H, seed=171 + T)
    want = MoeSplit(x, w, ids, q, LIMIT, _tiles(variant))().clone()
    run = MoeSplit(x, w, ids, q, LIMIT, _tiles(variant))
    run.trace = (torch.zeros((run.P * run.nt1, 4), dtype=torch.int64, device=DEV),
                 torch.zeros((run.P * run.nt2 * run.s2, 4), dtype=torch.int64, device=DEV))
    got = run()
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for stage, tr in enumerate(run.trace):
        tr = tr.cpu()
        assert (tr[:, 0] > 0).all() and (tr[:, 1] >= tr[:, 0]).all(), stage   # every pair is local here
        assert ((tr[:, 2] >= 0) & (tr[:, 2] < sms)).all()
        if stage == 1:
            assert ((tr[:, 3] >= tr[:, 0]) & (tr[:, 3] <= tr[:, 1])).all()
    assert run.trace[1][:, 1].min() >= run.trace[0][:, 1].max()   # down ends after every gate_up program
