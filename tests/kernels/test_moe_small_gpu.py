"""Decode-sized split-K fused MoE (``triton_moe_small_split``) vs the torch reference ``moe_experts``.

Fresh random inputs per case; the allocator's free memory is NaN-poisoned before each call so an
unwritten output element shows up. ``exact`` is the torch op on the dequantized (fp32) expert
weights, so ``e_ref = |ref - exact| / |exact|`` is the reference's own FP8 emulation error (it
quantizes activations 1x128; this path keeps them bf16): |split - exact| <= 0.5 * e_ref + 2e-3.
On a GPU: real gpt-oss shapes (20B: 32 experts, 120B: 128, H = I = 2880, top-4). On the CPU
(``TRITON_INTERPRET=1 DAYZERO_KERNEL_TEST_DEVICE=cpu pytest --noconftest ...``): small odd shapes.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from dayzero.kernels import torch_ops as ref
from dayzero.kernels.types import ExpertWeights
from dayzero.weights import fp8
from gpu_util import DEV, poison, rel

pytest.importorskip("triton", reason="the Triton kernels need triton (GPU machines)")  # CI: skip at collection
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEV == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LIMIT = 7.0
K_TOP = 4
# name -> (E, H, I); the CPU interpreter gets small shapes that are not multiples of 128
SHAPES = {"20b": (32, 2880, 2880), "120b": (128, 2880, 2880)} if DEV == "cuda" else \
    {"20b": (8, 208, 336), "120b": (24, 136, 200)}


CHUNK = 16  # experts built per step (keeps the GPU peak near the kept tensors: the final run tests files in parallel)


def _packed(shape, std, g) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random [E, N, K] weights -> (fp8, block scales, the fp8 values dequantized to fp32)."""
    E, N, K = shape
    w8 = torch.empty(shape, dtype=torch.float8_e4m3fn, device=DEV)
    sc = torch.empty((E, -(-N // 128), -(-K // 128)), dtype=torch.float32, device=DEV)
    deq = torch.empty(shape, dtype=torch.float32, device=DEV)
    for e in range(0, E, CHUNK):
        w8[e:e + CHUNK], sc[e:e + CHUNK] = fp8.quantize_weight_block(
            torch.randn((min(CHUNK, E - e), N, K), device=DEV, generator=g) * std)
        deq[e:e + CHUNK] = fp8.dequantize_weight_block(w8[e:e + CHUNK], sc[e:e + CHUNK])
    return w8, sc, deq


@functools.lru_cache(maxsize=2)
def experts(name: str) -> tuple[ExpertWeights, ExpertWeights]:
    """(fp8 experts, the same dequantized to fp32), gpt-oss-like magnitudes; built once per shape."""
    E, H, I = SHAPES[name]
    g = torch.Generator(device=DEV).manual_seed(E)
    gu, gus, gud = _packed((E, 2 * I, H), 0.03, g)
    dn, dns, dnd = _packed((E, H, I), 0.02, g)
    gub = (torch.randn(E, 2 * I, device=DEV, generator=g) * 0.5).bfloat16()
    dnb = (torch.randn(E, H, device=DEV, generator=g) * 0.5).bfloat16()
    if DEV == "cuda":
        torch.cuda.empty_cache()  # hand the chunks' temporaries back
    q = ExpertWeights(gate_up=gu, gate_up_bias=gub, down=dn, down_bias=dnb, gate_up_scale=gus, down_scale=dns,
                      derived={"expert_offset": 0})
    d = ExpertWeights(gate_up=gud, gate_up_bias=gub, down=dnd, down_bias=dnb, derived={"expert_offset": 0})
    return q, d


def inputs(T: int, E_global: int, H: int, seed: int, repeated: bool = False):
    """x [T, H] bf16, routing weights [T, k] bf16, ids [T, k] int64 (repeated: every token picks the
    same k experts, in a different order per token, so one expert gets all T tokens)."""
    torch.manual_seed(seed)
    x = (torch.randn(T, H, device=DEV) * 1.5).bfloat16()
    logits = torch.randn(T, E_global, device=DEV).bfloat16()
    w, ids = ref.router_topk(logits, K_TOP)
    if repeated:
        ids = torch.stack([torch.randperm(K_TOP) for _ in range(T)]).to(DEV) + 1
    return x, w, ids



def ep_slice(a: ExpertWeights, offset: int, n: int) -> ExpertWeights:
    """Experts [offset, offset + n) of ``a`` as an expert-parallel rank holds them."""
    sl = slice(offset, offset + n)
    return ExpertWeights(a.gate_up[sl], a.gate_up_bias[sl], a.down[sl], a.down_bias[sl],
                         a.gate_up_scale[sl] if a.gate_up_scale is not None else None,
                         a.down_scale[sl] if a.down_scale is not None else None,
                         derived={"expert_offset": offset})


def check_ep_slice(local_routes: int, tiles, seed: int, ready=None):
    """T = 1 on a rank owning experts 8..15 of the 120B shapes: routes elsewhere are skipped (the down
    tickets count only local pairs); none local: zeros. ``ready(x, w, ids, experts)`` asserts the path taken."""
    from dayzero.kernels.triton_moe_small_split import moe_split

    q, d = experts("120b")
    E, H, _ = SHAPES["120b"]
    x, w, _ = inputs(1, E, H, seed=seed)
    ids = torch.tensor([[9, 1, 14, 3] if local_routes else [0, 1, 2, 3]], device=DEV)
    qs, ds = ep_slice(q, 8, 8), ep_slice(d, 8, 8)
    if ready is not None:
        assert ready(x, w, ids, qs)
    poison()
    out = moe_split(x, w, ids, qs, LIMIT, tiles)
    assert torch.isfinite(out).all()
    if not local_routes:
        assert (out == 0).all()
        return
    exact = ref.moe_experts(x, w, ids, ds, LIMIT)
    e_ref = rel(ref.moe_experts(x, w, ids, qs, LIMIT), exact)
    assert rel(out, exact) <= 0.5 * e_ref + 2e-3, (rel(out, exact), e_ref)
    assert _tickets_zero(qs)


def check_graph_replay(T: int, tiles, seed: int, wg: bool | None = None):
    """20B experts, T tokens: two calls give equal bits, and a CUDA graph of the call replayed on new tokens,
    routing weights and ids gives the eager call's bits; every ticket back at zero. ``wg``: the path it must take."""
    from dayzero.kernels.triton_moe_small_split import MoeSplit, moe_split

    if DEV != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    q, _ = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(T, E, H, seed=seed)
    run = MoeSplit(x, w, ids, q, LIMIT, tiles)
    if wg is not None:
        assert run.wg == wg
    first = run().clone()
    assert torch.equal(run(), first)                                        # bitwise repeatable
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run()
    for s in (seed + 1, seed + 2):
        x2, w2, ids2 = inputs(T, E, H, seed=s)
        run.x.copy_(x2)
        run.weights.copy_(w2)
        run.ids.copy_(ids2)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, moe_split(x2, w2, ids2, q, LIMIT, tiles))
    assert _tickets_zero(q)

def check(name, T, seed, tiles=None, repeated=False, offset=0, E_local=None):
    from dayzero.kernels.triton_moe_small_split import moe_split

    q, d = experts(name)
    E, H, _ = SHAPES[name]
    if E_local is not None:  # expert-parallel slice [offset, offset + E_local) of the E global experts
        q, d = ep_slice(q, offset, E_local), ep_slice(d, offset, E_local)
    x, w, ids = inputs(T, E, H, seed, repeated)
    ref_out = ref.moe_experts(x, w, ids, q, LIMIT)
    exact = ref.moe_experts(x, w, ids, d, LIMIT)
    poison()
    out = moe_split(x, w, ids, q, LIMIT, tiles)
    assert out.shape == (T, H) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all(), "unwritten (NaN) or non-finite output elements"
    e_ref = rel(ref_out, exact)
    assert rel(out, exact) <= 0.5 * e_ref + 2e-3, (rel(out, exact), e_ref)
    return out, exact, ids


@pytest.mark.parametrize("T", [1, 3, 16])
def test_registered_op_dispatch(T):
    # T = 1 and T = 16 (4 and 64 pairs) take the split-K path, T = 3 (12 pairs, < 64 experts) the aligned
    # one unless the tiles there load their scales once (row_scales)
    from dayzero.kernels.triton_moe import moe_experts   # the op registered as triton's moe_experts
    from dayzero.kernels.triton_moe_small_split import default_tiles, moe_split, takes_split

    q, _ = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(T, E, H, seed=4)
    aligned = T == 3 and not default_tiles(T * K_TOP, E).row_scales
    assert takes_split(T * K_TOP, E) == (not aligned)
    if aligned and DEV != "cuda":
        pytest.skip("the aligned path is checked on the GPU (tests/kernels/test_moe_gpu.py)")
    want = moe_split(x, w, ids, q, LIMIT)
    if aligned:
        from dayzero.kernels.triton_moe import fused_moe

        want = fused_moe(x, w, ids, q, LIMIT)
    if DEV == "cuda":
        from dayzero.kernels.registry import get_ops

        assert get_ops("triton").moe_experts is moe_experts
    assert torch.equal(moe_experts(x, w, ids, q, LIMIT), want)


# ---- split-K path (triton_moe_small_split): every candidate configuration at every test T ----

def _split_variants():
    from dayzero.kernels.triton_moe_small_split import VARIANTS

    return VARIANTS


def _tickets_zero(q: ExpertWeights) -> bool:
    return all(int(v.abs().sum()) == 0 for k, v in q.derived.items() if k.startswith("moe_split_tickets"))


SPLIT_TS = [1, 2, 7, 16, 33, 64] if DEV == "cuda" else [1, 5, 9]
if os.environ.get("DAYZERO_MOE_SMALL_TEST_TS"):  # a device call's subset, e.g. "1,2,7"
    SPLIT_TS = [int(t) for t in os.environ["DAYZERO_MOE_SMALL_TEST_TS"].split(",")]


@pytest.mark.parametrize("variant", list(_split_variants()))
@pytest.mark.parametrize("T", SPLIT_TS)
@pytest.mark.parametrize("name", ["20b", "120b"])
def test_split_vs_reference(name, T, variant):
    check(name, T, seed=T, tiles=_split_variants()[variant])
    assert _tickets_zero(experts(name)[0])  # every ticket reset by its last user


RUN10 = {"row_scales": True, "vec_combine": True, "ids_once": True}   # the run-10 candidates' options


@pytest.mark.parametrize("T,tiles", [(5, {}), (20, {}), (64, {"bn_gate_up": 64, "bn_down": 64}),
                                     (6, {"split_gate_up": 3, "split_down": 5}), (5, RUN10),
                                     (6, {"split_gate_up": 3, "split_down": 5, **RUN10})])
def test_split_repeated_experts(T, tiles):
    # every token routes to experts 1..4: each gets all T rows (T > 16: the chunk loop over the plan table)
    from dayzero.kernels.triton_moe_small_split import SplitTiles

    check("20b", T, seed=200 + T, tiles=SplitTiles(**tiles), repeated=True)


@pytest.mark.parametrize("T", [6, 24])   # 24 pairs: fused combine, leader slots; 96: plan + combine launch
def test_split_expert_parallel_slice_and_unrouted_tokens(T):
    out, exact, ids = check("120b", T, seed=11, offset=8, E_local=8)
    local = ((ids >= 8) & (ids < 16)).any(1)
    assert (~local).any() and local.any()
    assert (out[~local] == 0).all()


@pytest.mark.parametrize("T,variant", [(2, None), (24, None), (2, "k1_d64_r"), (1, "gvq2_d64_rp"), (4, "gvqt8_d32_rp")])
def test_split_no_local_route_gives_zeros(T, variant):
    # k1_d64_r: the fused down's vectorised combine (``_combine_rows``) writes the zeros; ``_rp``: under PDL
    # (the zeros written after the wait for gate_up), GEMV gate_up at T = 1 and per pair at T = 4
    from dayzero.kernels.triton_moe_small_split import VARIANTS, moe_split

    q, _ = experts("120b")
    E, H, _ = SHAPES["120b"]
    x, w, ids = inputs(T, E, H, seed=5)
    ids = ids % 4                                           # every route on experts 0..3
    qs = ep_slice(q, 8, 8)                                  # this rank owns 8..15: nothing routed here
    poison()
    out = moe_split(x, w, ids, qs, LIMIT, VARIANTS[variant] if variant else None)
    assert out.shape == (T, H) and (out == 0).all()


@pytest.mark.parametrize("T,variant", [(1, None), (2, None), (4, None), (8, None), (16, None), (1, "k1"),
                                       (1, "gvg_d32_r"), (2, "k1_d64_r"), (1, "gvq_d32"), (2, "gvq2_d64_r"),
                                       (7, "gvqt8_d32_r"), (1, "gvq2_d64_rp"), (8, "bn64_r_x16"), (16, "bn64_x16")])
def test_split_deterministic_and_graph_replay_equals_eager(T, variant):
    # default tiles: T = 1 on the GEMV kernels, T = 2-4 GEMV gate_up per pair with PDL, fused MMA tiles
    # (leader slots, tickets in down), plan + combine at T = 16; k1: the MMA kernels at T = 1; _r: scale rows
    # and the vectorised combine; gvq2_d64_rp at T = 1: GEMV gate_up + MMA down under PDL
    from dayzero.kernels.triton_moe_small_split import VARIANTS

    check_graph_replay(T, VARIANTS[variant] if variant else None, seed=1)


@pytest.mark.parametrize("variant", ["gv_d16", "gvg_d32_r", "gvq_d32_r", "gvq2_d64_rp"])
@pytest.mark.parametrize("local_routes", [0, 2])
def test_gemv_t1_expert_parallel_slice(local_routes, variant):
    # T = 1 on the GEMV kernels with this rank owning experts 8..15: routes elsewhere are skipped (the
    # down tickets count only local routes); none local: zeros. gvg_d32_r: GEMV gate_up, MMA down
    # with the vectorised combine; gvq: grouped GEMV products (gvq2_d64_rp: under PDL)
    from dayzero.kernels.triton_moe_small_split import VARIANTS, MoeSplit

    tiles = VARIANTS[variant]
    check_ep_slice(local_routes, tiles, seed=21 + local_routes,
                   ready=lambda *args: MoeSplit(*args, LIMIT, tiles).gemv)


@pytest.mark.parametrize("T,repeated", [(2, False), (2, True)])
def test_gemv_gate_up_per_pair(T, repeated):
    # gate_up on the GEMV kernel at T > 1 (one program per pair; repeated: both tokens on the same experts,
    # each expert's tiles read once per pair), MMA down on the expert slots
    from dayzero.kernels.triton_moe_small_split import VARIANTS, MoeSplit

    tiles = VARIANTS["gvq2_d64_rp"]
    q, _ = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(T, E, H, seed=31, repeated=repeated)
    assert MoeSplit(x, w, ids, q, LIMIT, tiles).gemv
    check("20b", T, seed=31, tiles=tiles, repeated=repeated)
    assert _tickets_zero(q)


def test_tiles_override_from_environment(monkeypatch):
    from dayzero.kernels.triton_moe_small_split import TILES_ENV, VARIANTS, default_tiles

    monkeypatch.setenv(TILES_ENV, "gv_d16@4,k1_d32@32")
    assert default_tiles(4, 32) is VARIANTS["gv_d16"]
    assert default_tiles(8, 32) is VARIANTS["k1_d32"]
    assert default_tiles(64, 32) is VARIANTS["bn64_x16"]          # past every entry: the built-in default
    monkeypatch.setenv(TILES_ENV, "nope@4")
    with pytest.raises(ValueError, match="NAME"):
        default_tiles(4, 32)


def test_split_rejects_bad_input():
    from dayzero.kernels.triton_moe_small_split import SplitTiles, moe_split

    q, _ = experts("20b")
    E, H, _ = SHAPES["20b"]
    x, w, ids = inputs(3, E, H, seed=4)
    with pytest.raises(ValueError, match="shapes disagree"):
        moe_split(x[:, :-1], w, ids, q, LIMIT)
    with pytest.raises(ValueError, match="fp8"):
        moe_split(x, w, ids, ExpertWeights(q.gate_up, q.gate_up_bias, q.down, q.down_bias), LIMIT)
    with pytest.raises(ValueError, match="N tile"):
        moe_split(x, w, ids, q, LIMIT, SplitTiles(bn_gate_up=48))
    with pytest.raises(ValueError, match="bf16"):
        moe_split(x.float(), w, ids, q, LIMIT)
    assert moe_split(x[:0], w[:0], ids[:0], q, LIMIT).shape == (0, H)
