"""Triton dense FP8 linear, RMSNorm+FP8 quantization and router top-k vs the torch reference ops.

Every case draws fresh random inputs and first fills the CUDA caching allocator's free memory with
NaN, so an output element a kernel forgot to write shows up as NaN. FP8 paths are judged against
the error of the reference's own FP8 emulation (``e_ref`` = |torch FP8 op - exact| / |exact|, where
exact uses the same dequantized weights and unquantized activations):
  * every path: |triton - exact| <= 1.2 * e_ref + 2e-3 (never worse than the reference emulation);
  * paths that quantize activations like the reference: |triton - ref| <= 0.25 * e_ref + 5e-3.
"""

from __future__ import annotations


import pytest
import torch

from dayzero.kernels import torch_ops as ref
from dayzero.kernels.types import LinearWeight
from dayzero.weights import fp8
from gpu_util import DEV, poison, rel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def make_weight(n: int, k: int, bias: bool = True, std: float = 0.02) -> LinearWeight:
    w = torch.randn(n, k, device=DEV) * std
    w[:, : min(k, 7)] *= 20  # a few outlier columns: block scales must be per block
    q, s = fp8.quantize_weight_block(w)
    b = torch.randn(n, device=DEV).bfloat16() if bias else None
    return LinearWeight(weight=q, bias=b, scale=s)


def exact_linear(x: torch.Tensor, lw: LinearWeight) -> torch.Tensor:
    y = x.double() @ fp8.dequantize_weight_block(lw.weight, lw.scale).double().t()
    return y + lw.bias.double() if lw.bias is not None else y


def check_fp8(out, ref_out, exact, same_quant: bool) -> None:
    assert torch.isfinite(out).all(), "unwritten (NaN) or non-finite output elements"
    e_ref = rel(ref_out, exact)
    assert rel(out, exact) <= 1.2 * e_ref + 2e-3, (rel(out, exact), e_ref)
    if same_quant:
        assert rel(out, ref_out) <= 0.25 * e_ref + 5e-3, (rel(out, ref_out), e_ref)


# (M, K, N): qkv/o/lm_head-like shapes incl. the partial 2880 = 22*128 + 64 blocks, M below and above SMALL_M
SHAPES = [(1, 2880, 5120), (17, 2880, 512), (64, 4096, 2880), (65, 2880, 5120), (300, 4096, 2880),
          (1024, 2880, 5120), (3, 2880, 201088), (257, 2880, 201088), (130, 320, 200)]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_linear_bf16_input(m, k, n):
    from dayzero.kernels.triton_linear import SMALL_M, linear

    torch.manual_seed(m * 7 + n)
    lw = make_weight(n, k)
    x = (torch.randn(m, k, device=DEV) * 2).bfloat16()
    poison()
    out = linear(x, lw)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    check_fp8(out, ref.linear(x, lw), exact_linear(x, lw), same_quant=m > SMALL_M)


@pytest.mark.parametrize("m,k,n", [(1, 2880, 4096), (40, 2880, 512), (700, 2880, 4096), (129, 2880, 201088)])
def test_rms_norm_quant_then_linear(m, k, n):
    from dayzero.kernels.triton_linear import linear, rms_norm_quant

    torch.manual_seed(m + n)
    x = (torch.randn(m, k, device=DEV) * 3).bfloat16()
    x[0, 100:228] = 0  # an all-zero group
    w = torch.rand(k, device=DEV) + 0.5
    poison()
    q, s = rms_norm_quant(x, w, 1e-5)
    rq, rs = ref.rms_norm_quant(x, w, 1e-5)
    assert q.shape == rq.shape and q.dtype == torch.float8_e4m3fn and s.shape == rs.shape
    assert torch.isfinite(s).all()
    qp, sp = q._dayzero_padded  # rows padded to 16 (cuBLAS) and columns to 128: zeros, scale 1
    assert qp.shape == (-(-m // 16) * 16, -(-k // 128) * 128) and sp.shape == (qp.shape[1] // 128, qp.shape[0])
    assert (qp[m:].view(torch.uint8) == 0).all() and (qp[:, k:].view(torch.uint8) == 0).all()
    assert (sp[:, m:] == 1).all()
    nz = rs != 1.0  # the reference gives an all-zero group scale 1; codes are 0 either way
    torch.testing.assert_close(s[nz], rs[nz], rtol=1e-6, atol=0)
    dq, drq = fp8.dequantize_act_group(q, s), fp8.dequantize_act_group(rq, rs)
    assert (dq - drq).abs().max() <= drq.abs().max() / 8  # at most a rounding tie's ulp apart
    assert (dq != drq).float().mean() < 1e-3
    lw = make_weight(n, k)
    poison()
    out = linear(q, lw, s)
    ref_out = ref.linear(rq, lw, rs)
    exact = exact_linear(ref.rms_norm(x, w, 1e-5), lw)
    check_fp8(out, ref_out, exact, same_quant=True)


@pytest.mark.parametrize("path", ["cublas", "triton", "triton_tma"])
def test_fp8_gemm_paths(path):
    from dayzero.kernels import triton_linear as tl_

    torch.manual_seed(len(path))
    m, k, n = 2048, 2880, 5120
    lw = make_weight(n, k)
    x = torch.randn(m, k, device=DEV).bfloat16()
    q, s_t = tl_.quantize_rows(x)
    rq, rs = fp8.quantize_act_group(x)
    torch.testing.assert_close(s_t.t(), rs, rtol=1e-6, atol=0)
    poison()
    if path == "cublas":
        if not tl_._cublas_blockwise_available(q.device):
            pytest.skip("no cuBLAS 1x128/128x128 blockwise scaled_mm on this device")
        out = tl_.gemm_fp8_cublas(q, s_t, lw)
        assert lw.derived["triton_fp8"].w_pad.shape == (n, 2944)  # K padded once, at first use
    else:
        out = tl_.gemm_fp8_triton(q, s_t, lw, tma=path.endswith("tma"))
    check_fp8(out, ref.linear(rq, lw, rs), exact_linear(x, lw), same_quant=True)


@pytest.mark.parametrize("m,n,k", [(1, 512, 2880), (7, 4096, 2880), (33, 2880, 4096), (2, 201088, 2880)])
@pytest.mark.parametrize("split_k", [1, None, 5])
def test_w8a16_split_k(m, n, k, split_k):
    from dayzero.kernels.triton_linear import gemm_w8a16_triton

    torch.manual_seed(m + n + (split_k or 0))
    lw = make_weight(n, k)
    x = torch.randn(m, k, device=DEV).bfloat16()
    poison()
    out = gemm_w8a16_triton(x, lw, split_k=split_k)
    check_fp8(out, ref.linear(x, lw), exact_linear(x, lw), same_quant=False)


def test_linear_dense_weight_matches_reference():
    from dayzero.kernels.triton_linear import linear

    x = torch.randn(33, 2880, device=DEV).bfloat16()
    lw = LinearWeight(weight=torch.randn(32, 2880, device=DEV).bfloat16() * 0.02,
                      bias=torch.randn(32, device=DEV).bfloat16())
    out = linear(x, lw)
    assert rel(out, ref.linear(x, lw)) < 1e-2


@pytest.mark.parametrize("t,e", [(1, 32), (77, 32), (4096, 128), (5, 128)])
def test_router_topk(t, e):
    from dayzero.kernels.triton_moe import router_topk

    torch.manual_seed(t + e)
    logits = torch.randn(t, e, device=DEV).bfloat16()
    logits[0, :8] = logits[0, 8]  # ties: the lower expert id wins, as torch.topk
    poison()
    w, ids = router_topk(logits, 4)
    rw, rids = ref.router_topk(logits, 4)
    assert w.dtype == rw.dtype == torch.bfloat16 and ids.dtype == torch.int64
    # same selected logits in the same (descending) order; ids unique per token
    torch.testing.assert_close(logits.gather(1, ids), logits.gather(1, rids), rtol=0, atol=0)
    assert (ids.sort(1).values.diff(dim=1) > 0).all()
    top5 = logits.float().topk(5, dim=1).values
    distinct = (top5.diff(dim=1) != 0).all(dim=1)  # rows without ties among the 5 largest logits
    assert torch.equal(ids[distinct], rids[distinct])
    torch.testing.assert_close(w.float(), rw.float(), rtol=0, atol=2 ** -8)  # within one bf16 ulp of 1
