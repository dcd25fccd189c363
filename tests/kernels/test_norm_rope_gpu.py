"""Triton ``rms_norm`` and ``rope`` vs the torch reference ops (kernels/torch_ops.py).

Fresh random inputs per case; the allocator's free memory is NaN-poisoned first, so an output
element the kernel never wrote reads as NaN. rope reproduces the reference's bf16 rounding points
and must match it bit for bit in bf16; rms_norm may differ from it only by the fp32 summation order
of the mean square (at most one bf16 rounding step). On a CPU the same tests run under
``TRITON_INTERPRET=1 DAYZERO_KERNEL_TEST_DEVICE=cpu`` (small shapes only).
"""

from __future__ import annotations


import pytest
import torch

from dayzero.kernels import torch_ops as ref
from gpu_util import DEV, poison

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEV == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")]
BIG = DEV == "cuda"  # real gpt-oss shapes only on the GPU (the interpreter is slow)


NORM_SHAPES = [(1, 2880), (17, 2880), (1000, 2880), (3, 128), (5, 96), (2, 4096)] if BIG else \
    [(1, 96), (3, 128), (4, 200)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t,h", NORM_SHAPES)
def test_rms_norm(t, h, dtype):
    from dayzero.kernels.triton_norm_rope import rms_norm

    g = torch.Generator(device=DEV).manual_seed(t * 31 + h)
    x = torch.randn(t, h, device=DEV, generator=g) * torch.rand(t, 1, device=DEV, generator=g) * 40
    x[:, : min(h, 5)] *= 30  # outlier channels
    x = x.to(dtype)
    w = 1 + 0.1 * torch.randn(h, device=DEV, generator=g)
    poison()
    out = rms_norm(x, w, 1e-5)
    want = ref.rms_norm(x, w, 1e-5)
    assert out.shape == want.shape and out.dtype == dtype
    assert torch.isfinite(out).all(), "unwritten (NaN) or non-finite output"
    diff = (out.double() - want.double()).abs()
    if dtype == torch.bfloat16:  # at most one bf16 step (2^-8 relative) apart
        assert (diff <= want.double().abs() * 2.0 ** -7 + 1e-30).all(), diff.max().item()
        assert (out == want).float().mean() > 0.95
    else:
        assert (diff <= want.double().abs() * 1e-5 + 1e-6).all(), diff.max().item()


def test_rms_norm_strided_rows():
    """A row-strided view (e.g. a slice of a wider buffer) is read through its stride."""
    from dayzero.kernels.triton_norm_rope import rms_norm

    base = torch.randn(6, 160, device=DEV).bfloat16()
    x = base[:, :96]
    w = torch.rand(96, device=DEV) + 0.5
    poison()
    out = rms_norm(x, w, 1e-6)
    assert torch.isfinite(out).all()
    assert ((out.float() - ref.rms_norm(x, w, 1e-6).float()).abs() <= 2 ** -6).all()


def test_rms_norm_bad_input():
    from dayzero.kernels.triton_norm_rope import rms_norm

    with pytest.raises(ValueError, match="weight shape"):
        rms_norm(torch.randn(2, 8, device=DEV), torch.ones(9, device=DEV), 1e-5)
    assert rms_norm(torch.randn(0, 8, device=DEV), torch.ones(8, device=DEV), 1e-5).shape == (0, 8)


ROPE_SHAPES = [(1, 64, 8, 64), (333, 64, 8, 64), (8192, 64, 8, 64), (7, 8, 2, 16), (5, 4, 1, 32), (3, 6, 3, 48)] \
    if BIG else [(1, 8, 2, 16), (5, 4, 1, 32), (3, 6, 3, 48)]


def _tables(d: int, max_pos: int):
    from dayzero.config import preset
    from dayzero.model.rope import build_rope_tables
    import dataclasses

    cfg = dataclasses.replace(preset("20b"), head_dim=d)
    return build_rope_tables(cfg, max_pos, DEV)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t,hq,hkv,d", ROPE_SHAPES)
def test_rope(t, hq, hkv, d, dtype):
    from dayzero.kernels.triton_norm_rope import rope

    tab = _tables(d, 131072)
    g = torch.Generator(device=DEV).manual_seed(t + hq + d)
    # one fused qkv buffer, q and k as strided views of it (as a fused projection would give them)
    qkv = (torch.randn(t, hq + 2 * hkv, d, device=DEV, generator=g) * 3).to(dtype)
    q, k = qkv[:, :hq], qkv[:, hq:hq + hkv]
    pos = torch.randint(0, 131072, (t,), device=DEV, generator=g)
    pos[0] = 0
    poison()
    qo, ko = rope(q, k, tab.cos, tab.sin, pos)
    qr, kr = ref.rope(q, k, tab.cos, tab.sin, pos)
    for got, want in ((qo, qr), (ko, kr)):
        assert got.shape == want.shape and got.dtype == dtype
        assert torch.isfinite(got).all(), "unwritten (NaN) output"
        if dtype == torch.bfloat16:
            assert torch.equal(got, want), (got.float() - want.float()).abs().max().item()
        else:
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max().item()
    assert torch.equal(qkv[:, :hq], q), "rope must not modify its inputs"


def test_rope_bad_input():
    from dayzero.kernels.triton_norm_rope import rope

    tab = _tables(16, 64)
    q = torch.randn(3, 4, 16, device=DEV)
    k = torch.randn(3, 2, 16, device=DEV)
    with pytest.raises(ValueError, match="positions"):
        rope(q, k, tab.cos, tab.sin, torch.zeros(2, dtype=torch.int64, device=DEV))
    with pytest.raises(ValueError, match="cos"):
        rope(q, k, tab.cos[:, :4], tab.sin[:, :4], torch.zeros(3, dtype=torch.int64, device=DEV))


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs need the GPU")
def test_norm_rope_graph_replay():
    """Both ops are capturable: replay with new data and positions written in place."""
    from dayzero.kernels.triton_norm_rope import rms_norm, rope

    tab = _tables(64, 4096)
    x = torch.randn(4, 2880, device=DEV).bfloat16()
    w = torch.rand(2880, device=DEV) + 0.5
    q = torch.randn(4, 64, 64, device=DEV).bfloat16()
    k = torch.randn(4, 8, 64, device=DEV).bfloat16()
    pos = torch.tensor([0, 5, 100, 4095], device=DEV)
    rms_norm(x, w, 1e-5), rope(q, k, tab.cos, tab.sin, pos)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = rms_norm(x, w, 1e-5)
        qo, ko = rope(q, k, tab.cos, tab.sin, pos)
    for step in range(3):
        x.copy_(torch.randn_like(x))
        q.copy_(torch.randn_like(q))
        pos.copy_(torch.randint(0, 4096, (4,), device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(qo, ref.rope(q, k, tab.cos, tab.sin, pos)[0])
        assert ((y.float() - ref.rms_norm(x, w, 1e-5).float()).abs() <= 2 ** -6 * y.float().abs() + 1e-6).all()


@pytest.mark.skipif(DEV != "cuda", reason="the triton backend resolves only on a CUDA device")
def test_registry_has_no_norm_rope_fallback():
    from dayzero.kernels.registry import get_ops

    ops = get_ops("triton", "cuda")
    assert "rms_norm" not in ops.fallbacks and "rope" not in ops.fallbacks


@pytest.mark.parametrize("t,h", NORM_SHAPES)
def test_add_rms_norm(t, h):
    """Residual add fused into the norm: the sum equals the bf16 add bit for bit; the norm as rms_norm's."""
    from dayzero.kernels.triton_norm_rope import add_rms_norm, rms_norm

    g = torch.Generator(device=DEV).manual_seed(t * 7 + h)
    x = (torch.randn(t, h, device=DEV, generator=g) * 20).bfloat16()
    r = (torch.randn(t, h, device=DEV, generator=g) * 5).bfloat16()
    w = 1 + 0.1 * torch.randn(h, device=DEV, generator=g)
    poison()
    s, out = add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(s, x + r)
    assert torch.isfinite(out).all(), "unwritten (NaN) or non-finite output"
    assert torch.equal(out, rms_norm(x + r, w, 1e-5))


@pytest.mark.parametrize("t,h", [(1, 2880), (40, 2880), (300, 2880)] if BIG else [(1, 200), (5, 256)])
def test_add_rms_norm_quant(t, h):
    """The FP8 variant: sum bit-exact, codes and scales equal to rms_norm_quant of the sum."""
    from dayzero.kernels.triton_linear import add_rms_norm_quant, rms_norm_quant

    g = torch.Generator(device=DEV).manual_seed(t + h)
    x = (torch.randn(t, h, device=DEV, generator=g) * 20).bfloat16()
    r = (torch.randn(t, h, device=DEV, generator=g) * 5).bfloat16()
    w = 1 + 0.1 * torch.randn(h, device=DEV, generator=g)
    poison()
    s, q, sc = add_rms_norm_quant(x, r, w, 1e-5)
    assert torch.equal(s, x + r)
    wq, wsc = rms_norm_quant(x + r, w, 1e-5)
    assert torch.equal(q.view(torch.uint8), wq.view(torch.uint8)) and torch.equal(sc, wsc)
    qp, sp = q._dayzero_padded
    assert (qp[t:].view(torch.uint8) == 0).all() and (sp[:, t:] == 1).all()


def test_add_rms_norm_rejects_mismatched_residual():
    from dayzero.kernels.triton_linear import add_rms_norm_quant
    from dayzero.kernels.triton_norm_rope import add_rms_norm

    x = torch.randn(3, 128, device=DEV).bfloat16()
    w = torch.ones(128, device=DEV)
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm(x, x[:2], w, 1e-5)
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm_quant(x, x.float(), w, 1e-5)
