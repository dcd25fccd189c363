"""Torch reference implementations of the dense ops (the oracle every GPU backend is tested against).

Conventions shared by every backend (the op signatures are the contract; shapes in comments):
  * activations are 2-D ``[T, features]`` (T = tokens of every sequence of the batch, concatenated);
  * the result dtype of an op is the dtype of its activation input ``x`` unless stated otherwise;
  * FP8 weights are float8_e4m3fn with one fp32 scale per 128x128 block (``kernels.types``); FP8
    activations are quantized per token in groups of 128 channels (1x128) on the fly. The torch
    backend EMULATES the FP8 GEMM exactly: it quantizes the activations with
    ``dayzero.weights.fp8.quantize_act_group``, dequantizes activations and weights to fp32 and
    multiplies in fp32. A real FP8 kernel differs from this only by fp32 accumulation order.
"""

from __future__ import annotations

import torch

from .registry import register
from .types import ExpertWeights, LinearWeight

SWIGLU_ALPHA = 1.702  # gpt-oss: h = (up + 1) * gate * sigmoid(1.702 * gate)


def _fp8():
    from dayzero.weights import fp8  # imported lazily: only FP8 paths need it

    return fp8


@register("torch", "rms_norm")
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [T,H]``, ``w [H]`` -> ``[T,H]`` in x.dtype: ``w * x / sqrt(mean(x^2) + eps)`` computed in fp32
    (as HF: normalize in fp32, multiply by the (fp32) weight, cast back once)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w.float() * xf).to(x.dtype)


@register("torch", "rms_norm_quant")
def rms_norm_quant(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T,H]`` -> ``(x_fp8 [T,H] float8_e4m3fn, scale [T, ceil(H/128)] fp32)``: rms_norm (in fp32, not
    rounded to x.dtype first) followed by per-token 1x128 activation quantization. Feed the pair to
    ``linear(x_fp8, weight, x_scale=scale)``."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = (w.float() * xf).to(x.dtype)  # same rounding point as rms_norm -> quantize(rms_norm(x)) exactly
    return _fp8().quantize_act_group(y)


@register("torch", "add_rms_norm")
def add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm: ``s = x + r`` (rounded to x.dtype, as the unfused model's add) and
    ``rms_norm(s, w, eps)``; returns ``(s, normed)``, both ``[T,H]``."""
    s = x + r
    return s, rms_norm(s, w, eps)


@register("torch", "add_rms_norm_quant")
def add_rms_norm_quant(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``s = x + r`` then ``rms_norm_quant(s, w, eps)``; returns ``(s, x_fp8, scale)``."""
    s = x + r
    return (s, *rms_norm_quant(s, w, eps))


def _dequant_act(x: torch.Tensor, x_scale: torch.Tensor | None) -> torch.Tensor:
    """fp32 copy of the activations after the 1x128 FP8 round trip (or of an already quantized x)."""
    fp8 = _fp8()
    if x.dtype != torch.float8_e4m3fn:
        x, x_scale = fp8.quantize_act_group(x)
    elif x_scale is None:
        raise ValueError("linear: float8 activations need x_scale [T, ceil(K/128)]")
    return fp8.dequantize_act_group(x, x_scale)


@register("torch", "linear")
def linear(x: torch.Tensor, weight: LinearWeight, x_scale: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``y = x W^T + b``.

    x: ``[T, K]`` activations (fp32/bf16), or float8_e4m3fn already quantized per 1x128 group with
       ``x_scale [T, ceil(K/128)]`` (from ``rms_norm_quant``).
    weight: ``LinearWeight`` with ``weight [N, K]`` (fp32/bf16, or fp8 with ``scale [ceil(N/128), ceil(K/128)]``)
       and optional ``bias [N]``.
    Returns ``[T, N]`` in ``out_dtype`` (default: x.dtype, or bfloat16 when x is fp8).
    Dense weights: plain matmul in the weight dtype. FP8 weights: activations are quantized 1x128
    (unless already), both sides dequantized to fp32, matmul + bias in fp32, then cast.
    """
    if out_dtype is None:
        out_dtype = torch.bfloat16 if x.dtype == torch.float8_e4m3fn else x.dtype
    if not weight.is_fp8:
        if x.dtype == torch.float8_e4m3fn:
            x = _fp8().dequantize_act_group(x, x_scale)
        w = weight.weight
        b = weight.bias
        y = torch.nn.functional.linear(x.to(w.dtype), w, None if b is None else b.to(w.dtype))
        return y.to(out_dtype)
    if weight.scale is None:
        raise ValueError("linear: float8 weight without its block scale")
    xd = _dequant_act(x, x_scale)                                          # [T, K] fp32
    wd = _fp8().dequantize_weight_block(weight.weight, weight.scale)      # [N, K] fp32
    y = xd @ wd.t()
    if weight.bias is not None:
        y = y + weight.bias.float()
    return y.to(out_dtype)


@register("torch", "router_topk")
def router_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [T,E]`` -> ``(weights [T,k], ids [T,k] int64)``: the k largest logits, then a softmax over
    those k only. The softmax runs in logits.dtype (bf16 for bf16/FP8 models, as the seed insists;
    fp32 for fp32 models) and ``weights`` has that dtype. Ties resolve as ``torch.topk``."""
    top, ids = torch.topk(logits, k, dim=-1)
    weights = torch.softmax(top, dim=-1, dtype=top.dtype)
    return weights, ids


def _expert_matmul(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    """One expert GEMM: ``x [n, K] @ w[N, K]^T + b [N]``; FP8 weights emulate the block-scaled GEMM."""
    if w.dtype == torch.float8_e4m3fn:
        fp8 = _fp8()
        xd = fp8.dequantize_act_group(*fp8.quantize_act_group(x))
        return (xd @ fp8.dequantize_weight_block(w, scale).t() + b.float()).to(x.dtype)
    return torch.nn.functional.linear(x.to(w.dtype), w, b.to(w.dtype)).to(x.dtype)


@register("torch", "moe_experts")
def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                limit: float) -> torch.Tensor:
    """Routed experts with the clamped SwiGLU of gpt-oss and a weighted combine.

    x: ``[T, H]``; weights: ``[T, k]`` routing weights; ids: ``[T, k]`` int64 expert ids in
    ``[0, E)`` (ids outside ``[0, E)`` are skipped: an EP rank passes global ids and owns a slice
    through ``experts`` whose ``derived['expert_offset']`` (default 0) is the first global id).
    Per expert e and routed token t:
      ``gu = x_t W1[e]^T + b1[e]`` ([2I], gate = even, up = odd columns);
      ``gate = min(gate, limit)``, ``up = clamp(up, -limit, limit)``;
      ``h = (up + 1) * gate * sigmoid(1.702 * gate)``; ``y = h W2[e]^T + b2[e]`` ([H]).
    Output ``[T, H]`` (x.dtype) = sum over the k routes of ``weight * y``, accumulated in fp32.
    Activations are rounded to x.dtype between the GEMMs (and FP8-quantized 1x128 before each FP8 GEMM).
    """
    T, H = x.shape
    offset = int(experts.derived.get("expert_offset", 0))
    E = experts.num_experts
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    local = ids - offset
    flat = local.reshape(-1)
    for e in torch.unique(flat).tolist():
        if e < 0 or e >= E:
            continue
        tok, slot = torch.where(local == e)                                   # routes of expert e
        xe = x[tok]                                                           # [n, H]
        gu = _expert_matmul(xe, experts.gate_up[e], _idx(experts.gate_up_scale, e), experts.gate_up_bias[e])
        gate = gu[:, 0::2].clamp(max=limit)
        up = gu[:, 1::2].clamp(min=-limit, max=limit)
        h = ((up + 1) * (gate * torch.sigmoid(gate * SWIGLU_ALPHA))).to(x.dtype)  # [n, I]
        y = _expert_matmul(h, experts.down[e], _idx(experts.down_scale, e), experts.down_bias[e])  # [n, H]
        w = weights[tok, slot].unsqueeze(-1)
        out.index_add_(0, tok, (y * w).float())
    return out.to(x.dtype)


def _idx(t: torch.Tensor | None, e: int) -> torch.Tensor | None:
    return None if t is None else t[e]


@register("torch", "rope")
def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding, half-split (NeoX) layout: for x = [x1 | x2] (two halves of D),
    ``x1' = x1*cos - x2*sin``, ``x2' = x2*cos + x1*sin``.

    q: ``[T, Hq, D]``, k: ``[T, Hkv, D]``; cos/sin: ``[P, D/2]`` fp32 tables (YaRN attention scaling
    already folded in, see ``model.rope``); positions: ``[T]`` int64 (< P). Returns new (q, k) in
    their dtypes; cos/sin are cast to q.dtype first (as HF does).
    """
    c = cos[positions].to(q.dtype).unsqueeze(1)  # [T, 1, D/2]
    s = sin[positions].to(q.dtype).unsqueeze(1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    return rot(q), rot(k)
