"""Small-M FP8 linear with one-launch split-K (``triton_gemv``) vs the exact product of the same
dequantized weights, on fresh random inputs with poisoned outputs, incl. CUDA-graph replay (the
tickets must return to zero after every call, and the split-K sum is taken in split order: the same
bits from every call, graph or eager)."""

from __future__ import annotations

import pytest
import torch

from gpu_util import DEV, poison, rel
from test_linear_gpu import exact_linear, make_weight

pytest.importorskip("triton", reason="the Triton kernels need triton (GPU machines)")
from dayzero.kernels.triton_gemv import GemvConfig, gemv_fp8  # noqa: E402

# also under TRITON_INTERPRET=1 with DAYZERO_KERNEL_TEST_DEVICE=cpu (slow: pick cases with -k)
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEV == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# (N, K): q, k/v, o of 20B/120B, a partial-block odd N, and the lm_head
SHAPES = [(4096, 2880), (512, 2880), (2880, 4096), (200, 2880), (201088, 2880)]


CONFIGS = {"auto": GemvConfig(mode="bf16"), "bn32s5": GemvConfig(bn=32, split=5, mode="bf16"),
           "bn128s1": GemvConfig(bn=128, split=1, mode="bf16"), "bn16": GemvConfig(bn=16, target_programs=528, mode="bf16"),
           # session 7 candidates (DAYZERO_GEMV_MODE): fp16 products (bf16 x through power-of-two row scales);
           # "swap" runs fp8 x as e4m3 x e4m3 wgmma and bf16 x as dot16
           "dot16": GemvConfig(mode="dot16"), "bn32s5_dot16": GemvConfig(bn=32, split=5, mode="dot16"),
           "bn128s1_dot16": GemvConfig(bn=128, split=1, mode="dot16")}
MODES = {"bf16": GemvConfig(mode="bf16"), "dot16": GemvConfig(mode="dot16"), "swap": GemvConfig(mode="swap"),
         "swap_bn128": GemvConfig(bn=128, mode="swap"), "swap_bn32s5": GemvConfig(bn=32, split=5, mode="swap")}
CASES = ([(m, n, k, c) for n, k in SHAPES for m in (1, 4, 16) for c in ("auto", "dot16")]
         + [(m, n, k, c) for n, k in SHAPES[:4] for m in (1, 16)
            for c in ("bn32s5", "bn128s1", "bn16", "bn32s5_dot16", "bn128s1_dot16")])


@pytest.mark.parametrize("m,n,k,cfg", CASES, ids=[f"m{m}-{n}x{k}-{c}" for m, n, k, c in CASES])
def test_gemv_matches_exact(m, n, k, cfg):
    cfg = CONFIGS[cfg]
    torch.manual_seed(m * 7 + n + k)
    lw = make_weight(n, k)
    x = torch.randn(m, k, device=DEV).bfloat16()
    exact = exact_linear(x.float(), lw)
    first = None
    for _ in range(3):  # later calls find the workspace as the earlier ones left it
        poison()
        out = gemv_fp8(x, lw, cfg)
        assert torch.isfinite(out).all(), "unwritten output elements"
        assert rel(out, exact) < 8e-3, rel(out, exact)
        if first is None:
            first = out
        assert torch.equal(out, first), "split-K result differs between calls (sum order must be fixed)"
    for key, ws in lw.derived.items():
        if key.startswith("gemv_ws"):
            assert int(ws.tickets.abs().max()) == 0, "tickets not reset"


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs")
@pytest.mark.parametrize("mode", ["bf16", "dot16", "swap"])
def test_gemv_graph_replay_equals_eager(mode):
    from dayzero.weights import fp8

    torch.manual_seed(1)
    cfg = GemvConfig(mode=mode)
    lw = make_weight(4096, 2880)
    x_fp8 = mode == "swap"                  # swap's own path takes fp8 x (bf16 x runs dot16)

    def draw():
        x = torch.randn(8, 2880, device=DEV)
        return fp8.quantize_act_group(x) if x_fp8 else (x.bfloat16(), None)

    def exact(x, xs):
        return exact_linear(fp8.dequantize_act_group(x, xs) if x_fp8 else x.float(), lw)

    x, xs = draw()
    eager = gemv_fp8(x, lw, cfg, x_scale=xs)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        gemv_fp8(x, lw, cfg, x_scale=xs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv_fp8(x, lw, cfg, x_scale=xs)

    def refill():
        x2, xs2 = draw()
        x.copy_(x2)
        if xs is not None:
            xs.copy_(xs2)

    for i in range(20):
        refill()
        graph.replay()
        torch.cuda.synchronize()
        assert rel(out, exact(x, xs)) < 8e-3, i
    refill()
    graph.replay()
    torch.cuda.synchronize()
    # split-K partials are summed in split order: graph replay and eager give the same bits
    assert torch.equal(out, gemv_fp8(x, lw, cfg, x_scale=xs))
    del eager


@pytest.mark.parametrize("scale", [1e5, 1e30, 1e-20])
def test_gemv_dot16_rows_beyond_fp16_range(scale):
    """bf16 rows far outside fp16's range (and an all-zero 128-group) still match the exact product: the
    power-of-two row scales bring each K step of each row into fp16's range and take it out again."""
    torch.manual_seed(3)
    lw = make_weight(2880, 4096)
    x = torch.randn(4, 4096, device=DEV)
    x[1] *= scale
    x[2, 128:256] = 0
    x = x.bfloat16()
    exact = exact_linear(x.float(), lw)
    poison()
    out = gemv_fp8(x, lw, GemvConfig(mode="dot16"))
    assert torch.isfinite(out).all()
    for i in range(4):
        assert rel(out[i], exact[i]) < 8e-3, (i, rel(out[i], exact[i]))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("n,k", SHAPES[:4])
def test_gemv_fp8_activations_match_dequantized_product(m, n, k, mode):
    """float8 x with 1x128 scales (what rms_norm_quant hands q/k/v): equals the exact product of
    the dequantized activations and weights (no error beyond fp32 accumulation)."""
    from dayzero.weights import fp8

    torch.manual_seed(m + n + k)
    lw = make_weight(n, k)
    xq, xs = fp8.quantize_act_group(torch.randn(m, k, device=DEV))
    exact = exact_linear(fp8.dequantize_act_group(xq, xs), lw)
    poison()
    cfg = MODES[mode]
    out = gemv_fp8(xq, lw, cfg, x_scale=xs)
    assert torch.isfinite(out).all(), "unwritten output elements"
    assert rel(out, exact) < 4e-3, rel(out, exact)
    poison()
    xs_t = xs.t().contiguous().t()  # the group-major layout rms_norm_quant keeps: any strides are fine
    again = gemv_fp8(xq, lw, cfg, x_scale=xs_t)
    assert rel(again, exact) < 4e-3
    assert torch.equal(again, out), "split-K result differs between calls (sum order must be fixed)"
