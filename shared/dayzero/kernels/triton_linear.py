"""Triton backend: dense FP8 linear (128x128 weight blocks, 1x128 activation groups) and RMSNorm fused
with per-token FP8 quantization.

Activation quantization output layout (chosen for the GEMMs that consume it):
  * ``q``  [T, Kp] float8_e4m3fn, Kp = K rounded up to 128; columns K..Kp are written as 0.
  * ``s_t`` [ceil(K/128), T] float32, group-major: one scale per token per 128 columns, computed
    over the real columns of a partial last group (dequant: x ~= q * scale). ``s_t.t()`` is the
    [T, groups] view with strides (1, T) that cuBLAS' 1x128 blockwise mode wants.

Dense linear paths (``linear``):
  * M <= SMALL_M rows (decode): one Triton weight-only kernel, bf16 activations x FP8 weights widened
    in registers; bandwidth bound, no activation quantization (``triton_gemv``: split-K in one
    launch, when ``ONE_LAUNCH_SPLIT_K``).
  * larger M: quantize x (1x128) then ``torch.nn.functional.scaled_mm`` blockwise 1x128 x 128x128
    (cuBLAS) on Hopper, else the Triton FP8 kernel.
2880 is not a multiple of 128: for the cuBLAS path the weight is zero-padded along K to a multiple
of 128 ONCE, at first use, into ``LinearWeight.derived["triton_fp8"]`` (qkv and lm_head, K = 2880
-> 2944: +2.2% weight memory for that copy), and the activation quantizer writes the same zero
padding. The Triton kernels need no padding: they mask the K and N tails of the partial blocks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .registry import register
from .triton_gemv import gemv_fp8
from .triton_moe_gemm import interpreting, moe_gemm_kernel, tma_ok
from .types import BLOCK, LinearWeight

GROUP = BLOCK
FP8_MAX = tl.constexpr(448.0)
SCALE_FLOOR = tl.constexpr(1e-10)
SMALL_M = 16  # rows at or below which the weight-only kernel runs (bench/NOTES.md, run 2)
# small M through triton_gemv (split-K in one launch) or the one-launch-per-tile weight-only kernel;
# DAYZERO_SMALL_M_LINEAR=gemv|w8a16 overrides the default for side-by-side benchmarks (bench/NOTES.md)
ONE_LAUNCH_SPLIT_K = os.environ.get("DAYZERO_SMALL_M_LINEAR", "gemv") == "gemv"
ROW_ALIGN = 16  # activation buffers are padded to a multiple of 16 rows (cuBLAS blockwise needs it)


@triton.jit
def _quant_rows_kernel(
    x_ptr, w_ptr, q_ptr, s_ptr, sorted_ids_ptr, block_expert_ptr,
    T, K, stride_xm, stride_qm, stride_st, eps, num_pairs,
    NORM: tl.constexpr, NG: tl.constexpr, G: tl.constexpr,
    GATHER: tl.constexpr = False, TOPK: tl.constexpr = 1, BM: tl.constexpr = 1,
    r_ptr=None, sum_ptr=None, stride_rm=0, RES: tl.constexpr = False,
):
    row = tl.program_id(0)
    src = row
    ok = row < T  # rows T..Mp (padding to a multiple of 16) become zero rows
    if GATHER:  # output row = sorted MoE row; source = its token (padding rows are written as zeros)
        if tl.load(block_expert_ptr + row // BM) < 0:
            return
        pair = tl.load(sorted_ids_ptr + row)
        ok = pair < num_pairs
        src = tl.where(ok, pair // TOPK, 0)
    cols = tl.arange(0, NG * G)
    k_ok = cols < K
    x = tl.load(x_ptr + src.to(tl.int64) * stride_xm + cols, mask=k_ok & ok, other=0.0).to(tl.float32)
    if RES:  # residual add first (rounded to x.dtype, as the unfused add); the sum is an output too
        r = tl.load(r_ptr + src.to(tl.int64) * stride_rm + cols, mask=k_ok & ok, other=0.0).to(tl.float32)
        x = (x + r).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + src.to(tl.int64) * K + cols, x, mask=k_ok & ok)
        x = x.to(tl.float32)
    if NORM:
        var = tl.sum(x * x, axis=0) / K
        w = tl.load(w_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)
        x = (w * (x * tl.rsqrt(var + eps))).to(tl.bfloat16).to(tl.float32)  # RMSNorm output is bf16
    xg = tl.reshape(x, (NG, G))
    amax = tl.maximum(tl.max(tl.abs(xg), axis=1), SCALE_FLOOR)                 # [NG]
    scale = tl.where(ok, amax / FP8_MAX, 1.0)
    q = tl.reshape(xg / scale[:, None], (NG * G,)).to(tl.float8e4nv)
    kp = tl.cdiv(K, G) * G
    tl.store(q_ptr + row.to(tl.int64) * stride_qm + cols, q, mask=cols < kp)
    g = tl.arange(0, NG)
    tl.store(s_ptr + g * stride_st + row, scale, mask=g < tl.cdiv(K, G))


def _launch(x: torch.Tensor, w: torch.Tensor | None, eps: float, r: torch.Tensor | None = None,
            s: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s_t) of rows of x (normed when ``w``); with ``r``, rows of ``x + r`` and that sum written to ``s``."""
    if x.dim() != 2:
        raise ValueError(f"expected x [T, K], got shape {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if r is not None and r.stride(1) != 1:
        r = r.contiguous()
    T, K = x.shape
    ng = triton.cdiv(K, GROUP)
    mp = triton.cdiv(T, ROW_ALIGN) * ROW_ALIGN
    q = torch.empty((mp, ng * GROUP), dtype=torch.float8_e4m3fn, device=x.device)
    s_t = torch.empty((ng, mp), dtype=torch.float32, device=x.device)
    if mp > 0:
        ng_p2 = triton.next_power_of_2(ng)
        _quant_rows_kernel[(mp,)](
            x, w if w is not None else x, q, s_t, q, q, T, K, x.stride(0), q.stride(0), s_t.stride(0), eps, 0,
            NORM=w is not None, NG=ng_p2, G=GROUP, num_warps=4 if ng_p2 <= 16 else 8,
            r_ptr=r, sum_ptr=s, stride_rm=0 if r is None else r.stride(0), RES=r is not None,
        )
    return q, s_t


def quantize_gathered_rows(x: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor, num_pairs: int,
                           topk: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE: x [T, K] bf16 -> (q [Mpad, Kp] fp8, s_t [ceil(K/128), Mpad]) in expert-sorted row order
    (row r holds token sorted_ids[r] // topk; padding rows are zeros; rows of empty blocks unwritten),
    so the gate_up GEMM reads A with TMA instead of a pointer gather."""
    T, K = x.shape
    rows = sorted_ids.shape[0]
    ng = triton.cdiv(K, GROUP)
    q = torch.empty((rows, ng * GROUP), dtype=torch.float8_e4m3fn, device=x.device)
    s_t = torch.empty((ng, rows), dtype=torch.float32, device=x.device)
    ng_p2 = triton.next_power_of_2(ng)
    _quant_rows_kernel[(rows,)](
        x, x, q, s_t, sorted_ids, block_expert, T, K, x.stride(0), q.stride(0), s_t.stride(0), 0.0, num_pairs,
        NORM=False, NG=ng_p2, G=GROUP, GATHER=True, TOPK=topk, BM=block_m, num_warps=4 if ng_p2 <= 16 else 8,
    )
    return q, s_t


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] bf16 -> (q [Tp, Kp] fp8, s_t [ceil(K/128), Tp] fp32); Tp = T rounded up to 16 and
    Kp = K rounded up to 128, the padding written as zeros (scale 1): cuBLAS takes the buffers as is."""
    return _launch(x, None, 0.0)


def rms_norm_quantize_rows(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm (HF GptOss semantics, bf16 output) fused with :func:`quantize_rows`."""
    if w.shape != (x.shape[-1],):
        raise ValueError(f"norm weight shape {tuple(w.shape)} does not match hidden size {x.shape[-1]}")
    return _launch(x, w, eps)


@register("triton", "rms_norm_quant")
def rms_norm_quant(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [T,H], w [H], eps) -> (x_fp8 [T,H], scale [T, ceil(H/128)]).

    ``x_fp8`` is a view of a zero-padded [T, Hp] buffer and ``scale`` a (1, T)-strided view of a
    group-major buffer; ``linear`` recognises both and uses the buffers without a copy.
    """
    q, s_t = rms_norm_quantize_rows(x, w, eps)
    return _quant_views(q, s_t, *x.shape)


def _quant_views(q: torch.Tensor, s_t: torch.Tensor, T: int, H: int) -> tuple[torch.Tensor, torch.Tensor]:
    xq = q[:T, :H]
    xq._dayzero_padded = (q, s_t)  # the padded buffers these views come from (padding is zeros)
    return xq, s_t[:, :T].t()


@register("triton", "add_rms_norm_quant")
def add_rms_norm_quant(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x + r, *rms_norm_quant(x + r))`` in one launch (see the torch op)."""
    if r.shape != x.shape or r.dtype != x.dtype:
        raise ValueError(f"add_rms_norm_quant: residual {tuple(r.shape)} {r.dtype} must match x "
                         f"{tuple(x.shape)} {x.dtype}")
    if w.shape != (x.shape[-1],):
        raise ValueError(f"norm weight shape {tuple(w.shape)} does not match hidden size {x.shape[-1]}")
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    q, s_t = _launch(x, w, eps, r, s)
    return (s, *_quant_views(q, s_t, *x.shape))


@dataclass
class _Fp8Derived:
    w_pad: torch.Tensor   # [N, Kp] fp8; the original weight itself when K % 128 == 0
    ws_t: torch.Tensor    # [round_up(Kp/128, 4), ceil(N/128)] fp32 view with strides (1, rows): cuBLAS scale_b
    bias_in_gemm: bool = True  # cleared if cuBLAS refuses the bias epilogue with block scales


def _cublas_blockwise_available(device: torch.device) -> bool:
    return (device.type == "cuda" and hasattr(F, "scaled_mm") and hasattr(F, "ScalingType")
            and torch.cuda.get_device_capability(device) == (9, 0))


def _derived(weight: LinearWeight) -> _Fp8Derived:
    d = weight.derived.get("triton_fp8")
    if d is None:
        w, s = weight.weight, weight.scale
        N, K = w.shape
        kp = triton.cdiv(K, GROUP) * GROUP
        if kp != K:
            w_pad = torch.zeros((N, kp), dtype=w.dtype, device=w.device)
            w_pad[:, :K] = w
        else:
            w_pad = w.contiguous()
        nk = kp // GROUP
        rows = (nk + 3) // 4 * 4
        ws = torch.zeros((s.shape[0], rows), dtype=torch.float32, device=s.device)
        ws[:, :nk] = s
        d = _Fp8Derived(w_pad=w_pad, ws_t=ws.t())
        weight.derived["triton_fp8"] = d
    return d


def _check_fp8_weight(weight: LinearWeight) -> None:
    w, s = weight.weight, weight.scale
    if s is None or s.shape != (triton.cdiv(w.shape[0], GROUP), triton.cdiv(w.shape[1], GROUP)):
        raise ValueError(f"fp8 weight {tuple(w.shape)} needs a [ceil(N/128), ceil(K/128)] scale, got "
                         f"{None if s is None else tuple(s.shape)}")


def gemm_fp8_triton(q: torch.Tensor, s_t: torch.Tensor, weight: LinearWeight, out_dtype=torch.bfloat16,
                    bm: int = 128, bn: int = 128, warps: int = 8, stages: int = 3, tma: bool = True) -> torch.Tensor:
    """q [M, >=K] fp8, s_t [ceil(K/128), M] -> [M, N] (Triton FP8 x FP8, per-128-K-step scaling)."""
    w, s = weight.weight, weight.scale
    N, K = w.shape
    M = q.shape[0]
    out = torch.empty((M, N), dtype=out_dtype, device=q.device)
    bias = weight.bias
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    tma = tma and tma_ok(q, w)
    a_arg = TensorDescriptor.from_tensor(q, [bm, GROUP]) if tma else q
    b_arg = TensorDescriptor.from_tensor(w.unsqueeze(0), [1, bn, GROUP]) if tma else w
    moe_gemm_kernel[grid](
        a_arg, s_t, b_arg, s, bias if bias is not None else s, out, out,
        out, out, out,                       # routing tensors unused (ROUTED=False)
        M, N, K, M,
        q.stride(0), s_t.stride(0),
        0, w.stride(0), 0, s.stride(0), 0,
        out.stride(0), 0, 0.0, 0.0,
        TOPK=1, ROUTED=False, GATHER_A=False, SCATTER_C=False, A_FP8=True, EPI=0, QUANT_OUT=False,
        HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=GROUP, GROUP_M=8, num_warps=warps, num_stages=stages,
        A_TMA=tma, B_TMA=tma, DOT_F32=interpreting(),
    )
    return out


@triton.jit
def _splitk_reduce_kernel(ws_ptr, bias_ptr, out_ptr, MN, N, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < MN
    acc = tl.zeros((BLOCK,), tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(ws_ptr + s * MN + i, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + i % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _split_for(M: int, N: int, K: int, bm: int, bn: int, target_programs: int = 264) -> int:
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    nkb = triton.cdiv(K, GROUP)
    split = min(max(1, triton.cdiv(target_programs, tiles)), max(1, nkb // 4))  # >= 4 K blocks each
    return triton.cdiv(nkb, triton.cdiv(nkb, split))  # no empty splits


def gemm_w8a16_triton(x: torch.Tensor, weight: LinearWeight, bm: int = 16, bn: int = 64,
                      warps: int = 4, stages: int = 4, split_k: int | None = None) -> torch.Tensor:
    """x [M, K] bf16 x fp8 weight (widened in registers, block-scaled) -> [M, N] bf16; split-K
    (fp32 partials + one reduce that adds the bias) when the N tiles alone cannot fill the GPU."""
    w, s = weight.weight, weight.scale
    N, K = w.shape
    M = x.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    bias = weight.bias
    split = split_k or 1  # auto split-K (_split_for) lost to its extra launch in run 2: opt-in only
    c = out if split == 1 else torch.empty((split, M, N), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split)
    moe_gemm_kernel[grid](
        x, s, w, s, bias if bias is not None else s, c, c,
        c, c, c,
        M, N, K, M,
        x.stride(0), 0,
        0, w.stride(0), 0, s.stride(0), 0,
        N, 0, 0.0, 0.0,
        TOPK=1, ROUTED=False, GATHER_A=False, SCATTER_C=False, A_FP8=False, EPI=0, QUANT_OUT=False,
        HAS_BIAS=bias is not None and split == 1, BM=bm, BN=bn, BK=GROUP, GROUP_M=1, num_warps=warps,
        num_stages=stages, DOT_F32=interpreting(), SPLIT_K=split,
    )
    if split > 1:
        blk = 1024
        _splitk_reduce_kernel[(triton.cdiv(M * N, blk),)](c, bias if bias is not None else c, out, M * N, N,
                                                         SPLIT=split, HAS_BIAS=bias is not None, BLOCK=blk)
    return out


def gemm_fp8_cublas(q: torch.Tensor, s_t: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    """q [M, Kp] fp8 (zero-padded), s_t [Kp/128, M] -> [M, N] bf16 via cuBLAS 1x128 x 128x128 blocks."""
    d = _derived(weight)
    M = q.shape[0]
    pad = -M % 16  # cuBLAS refuses (NOT_SUPPORTED) 1x128 scales whose leading dimension M is not 16-aligned
    if pad:
        q = F.pad(q.view(torch.uint8), (0, 0, 0, pad)).view(torch.float8_e4m3fn)
        s_t = F.pad(s_t, (0, pad), value=1.0)
    ST = F.ScalingType
    args = (q, d.w_pad.t(), s_t.t(), ST.BlockWise1x128, d.ws_t, ST.BlockWise128x128)
    bias = weight.bias
    out = None
    if bias is not None and d.bias_in_gemm:
        try:
            out = F.scaled_mm(*args, bias=bias.to(torch.bfloat16), output_dtype=torch.bfloat16)
        except (RuntimeError, ValueError, NotImplementedError):
            d.bias_in_gemm = False
    if out is None:
        out = F.scaled_mm(*args, output_dtype=torch.bfloat16)
        if bias is not None:
            out += bias
    return out[:M] if pad else out


def _prequantized(xq: torch.Tensor, xs: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_fp8 [T, K], scale [T, ceil(K/128)]) -> (q [>=T, Kp] zero-padded, s_t [ceil(K/128), >=T])."""
    kp = triton.cdiv(K, GROUP) * GROUP
    if xs.shape != (xq.shape[0], kp // GROUP):
        raise ValueError(f"linear: x_scale {tuple(xs.shape)} does not fit x {tuple(xq.shape)}")
    padded = getattr(xq, "_dayzero_padded", None)   # from rms_norm_quant: the padded buffers, no copy
    if padded is not None and padded[0].shape[1] == kp:
        return padded
    q = xq.contiguous() if kp == K else F.pad(xq.view(torch.uint8), (0, kp - K)).view(torch.float8_e4m3fn)
    return q, xs.t().contiguous().float()


@register("triton", "linear")
def linear(x: torch.Tensor, weight: LinearWeight, x_scale: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Same contract as the torch op: ``x [T, K]`` (bf16/fp32, or float8 with ``x_scale
    [T, ceil(K/128)]`` from rms_norm_quant) -> ``[T, N]`` in out_dtype (x.dtype, bf16 for fp8 x)."""
    x_fp8 = x.dtype == torch.float8_e4m3fn
    if out_dtype is None:
        out_dtype = torch.bfloat16 if x_fp8 else x.dtype
    if not weight.is_fp8:  # dense weights (the router): plain matmul in the weight dtype, as the reference
        if x_fp8:
            if x_scale is None:
                raise ValueError("linear: float8 activations need x_scale [T, ceil(K/128)]")
            x = (x.float() * x_scale.float().repeat_interleave(GROUP, dim=-1)[:, :x.shape[1]])
        w, b = weight.weight, weight.bias
        return F.linear(x.to(w.dtype), w, None if b is None else b.to(w.dtype)).to(out_dtype)
    _check_fp8_weight(weight)
    N, K = weight.weight.shape
    if x.dim() != 2 or x.shape[1] != K:
        raise ValueError(f"linear: expected x [T, {K}], got shape {tuple(x.shape)}")
    if x_fp8:
        if x_scale is None:
            raise ValueError("linear: float8 activations need x_scale [T, ceil(K/128)]")
        if ONE_LAUNCH_SPLIT_K and x.shape[0] <= SMALL_M:  # decode q/k/v: no padding, no cuBLAS launch
            return gemv_fp8(x, weight, x_scale=x_scale).to(out_dtype)
        q, s_t = _prequantized(x, x_scale, K)
    elif x.shape[0] <= SMALL_M:
        xb = x.contiguous().to(torch.bfloat16)
        out = gemv_fp8(xb, weight) if ONE_LAUNCH_SPLIT_K else gemm_w8a16_triton(xb, weight)
        return out.to(out_dtype)
    else:
        q, s_t = quantize_rows(x)
    if _cublas_blockwise_available(q.device) and N % 16 == 0:
        out = gemm_fp8_cublas(q, s_t, weight)
    else:
        out = gemm_fp8_triton(q, s_t, weight)
    return out[: x.shape[0]].to(out_dtype)
