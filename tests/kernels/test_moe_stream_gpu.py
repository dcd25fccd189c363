"""Decode MoE at T = 1 in one persistent launch (``gluon_moe_stream``, tiles with ``SplitTiles.stream``) vs the
torch reference through ``MoeSplit``, with ``test_moe_small_gpu.py``'s helpers (fresh random inputs, NaN-poisoned
allocator, |out - exact| <= 0.5 * e_ref + 2e-3, e_ref the reference's own FP8 error). GPU only (Gluon, Hopper):
on other machines these tiles run the wg kernels, which ``test_moe_small_wg_gpu.py`` checks."""

from __future__ import annotations

import pytest
import torch

from dayzero.kernels import torch_ops as ref
from gpu_util import DEV, poison, rel

pytest.importorskip("triton", reason="the Triton kernels need triton (GPU machines)")  # CI: skip at collection
from test_moe_small_gpu import (LIMIT, SHAPES, check, check_ep_slice,  # noqa: E402
                               check_graph_replay, experts, inputs)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEV != "cuda" or not torch.cuda.is_available()
                                 or torch.cuda.get_device_capability() != (9, 0), reason="needs a Hopper GPU")]
STREAM = ["gx1_s20", "gx2_s8", "gx3_s4"]


def _tiles(name):
    from dayzero.kernels.triton_moe_small_split import VARIANTS

    return VARIANTS[name]


def _ctrl_ok(q, calls_before: int | None = None) -> bool:
    """Between calls: no CTA counted (done = 0); the last tag = the number of stream calls on these experts."""
    ctrl = q.derived["moe_stream_ctrl"].tolist()
    return ctrl[0] == 0 and (calls_before is None or ctrl[1] == calls_before)


def _takes_stream(x, w, ids, q, tiles) -> bool:
    from dayzero.kernels.triton_moe_small_split import MoeSplit

    return MoeSplit(x, w, ids, q, LIMIT, tiles).stream is not None


@pytest.mark.parametrize("variant", STREAM)
@pytest.mark.parametrize("name", ["20b", "120b"])
def test_stream_vs_reference(name, variant):
    tiles = _tiles(variant)
    q, _ = experts(name)
    E, H, _ = SHAPES[name]
    for seed in (60, 61, 62):        # back to back on the same words: each call's tag is new
        x, w, ids = inputs(1, E, H, seed=seed)
        assert _takes_stream(x, w, ids, q, tiles)
        before = q.derived["moe_stream_ctrl"].tolist()[1] if "moe_stream_ctrl" in q.derived else 0
        check(name, 1, seed=seed, tiles=tiles)
        assert _ctrl_ok(q, before + 1)


@pytest.mark.parametrize("variant", ["gx1_s20", "gx2_s8"])
def test_stream_repeated_expert(variant):
    # three routes of the token to the same expert: pairs reading the same weights, summed in pair order
    from dayzero.kernels.triton_moe_small_split import moe_split

    q, d = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, _ = inputs(1, E, H, seed=63)
    ids = torch.tensor([[5, 17, 5, 5]], device=DEV)
    exact = ref.moe_experts(x, w, ids, d, LIMIT)
    e_ref = rel(ref.moe_experts(x, w, ids, q, LIMIT), exact)
    poison()
    out = moe_split(x, w, ids, q, LIMIT, _tiles(variant))
    assert torch.isfinite(out).all()
    assert rel(out, exact) <= 0.5 * e_ref + 2e-3, (rel(out, exact), e_ref)
    assert _ctrl_ok(q)


@pytest.mark.parametrize("local_routes", [0, 2])
@pytest.mark.parametrize("variant", ["gx1_s20", "gx2_s8"])
def test_stream_expert_parallel_slice(local_routes, variant):
    tiles = _tiles(variant)
    check_ep_slice(local_routes, tiles, seed=64, ready=lambda x, w, ids, q: _takes_stream(x, w, ids, q, tiles))


@pytest.mark.parametrize("variant", STREAM)
def test_stream_deterministic_and_graph_replay_equals_eager(variant):
    check_graph_replay(1, _tiles(variant), seed=65)


def test_stream_h_near_its_bound():
    # x 40x larger: most gate / up values clamp, |h| up to (limit + 1) * limit, where h's fixed e4m3 scale
    # saturates if it is wrong
    from dayzero.kernels.triton_moe_small_split import moe_split

    q, d = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(1, E, H, seed=66)
    x = (x.float() * 40).bfloat16()
    exact = ref.moe_experts(x, w, ids, d, LIMIT)
    e_ref = rel(ref.moe_experts(x, w, ids, q, LIMIT), exact)
    poison()
    out = moe_split(x, w, ids, q, LIMIT, _tiles("gx2_s8"))
    assert torch.isfinite(out).all()
    assert rel(out, exact) <= 0.5 * e_ref + 2e-3, (rel(out, exact), e_ref)


def test_stream_falls_back_above_one_token():
    # T = 2: the wg kernels of the same tiles
    from dayzero.kernels.triton_moe_small_split import MoeSplit

    q, _ = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(2, E, H, seed=67)
    run = MoeSplit(x, w, ids, q, LIMIT, _tiles("gx2_s8"))
    assert run.stream is None
    check("20b", 2, seed=67, tiles=_tiles("gx2_s8"))
