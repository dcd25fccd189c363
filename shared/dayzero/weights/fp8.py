"""FP8 e4m3 block quantization (torch reference): 128x128 weight blocks, 1x128 activation groups.

Weights ``w [..., N, K]`` get one fp32 scale per 128x128 block, ``scale [..., ceil(N/128),
ceil(K/128)]``, with ``dequant = w_fp8 * scale``. Nothing is padded in storage: when N or K is not a
multiple of 128 (2880 = 22 * 128 + 64), the edge block is partial and its scale is computed over its
real rows/columns only (amax / 448), so a partial block loses no precision to phantom zeros.
Activations ``x [T, K]`` get one scale per token per 128 channels, ``[T, ceil(K/128)]``, the last
group partial in the same way. An all-zero block gets scale 1 (its codes are all zero).
"""

from __future__ import annotations

import torch

BLOCK = 128
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def expand_block_scale(scale: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """[..., nb, kb] -> [..., n, k]: every element gets the scale of its 128x128 block."""
    return scale.repeat_interleave(BLOCK, dim=-2)[..., :n, :].repeat_interleave(BLOCK, dim=-1)[..., :k]


def block_amax(w: torch.Tensor) -> torch.Tensor:
    """max |w| per 128x128 block over the real extent: [..., N, K] -> [..., ceil(N/128), ceil(K/128)] fp32."""
    *lead, n, k = w.shape
    nb, kb = _cdiv(n, BLOCK), _cdiv(k, BLOCK)
    a = w.detach().abs().float()
    if n % BLOCK or k % BLOCK:  # zero padding never raises a max of absolute values
        a = torch.nn.functional.pad(a, (0, kb * BLOCK - k, 0, nb * BLOCK - n))
    return a.reshape(*lead, nb, BLOCK, kb, BLOCK).amax(dim=(-3, -1))


def quantize_weight_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., N, K]`` -> ``(w_fp8 [..., N, K] float8_e4m3fn, scale [..., ceil(N/128), ceil(K/128)] fp32)``."""
    if w.dim() < 2:
        raise ValueError(f"quantize_weight_block needs [..., N, K], got shape {tuple(w.shape)}")
    *_, n, k = w.shape
    scale = _scale_from_amax(block_amax(w))
    q = (w.float() / expand_block_scale(scale, n, k)).clamp_(-FP8_MAX, FP8_MAX)
    return q.to(FP8_DTYPE), scale


def dequantize_weight_block(w_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(w_fp8 [..., N, K], scale [..., ceil(N/128), ceil(K/128)])`` -> fp32 ``[..., N, K]``."""
    *_, n, k = w_fp8.shape
    if tuple(scale.shape[-2:]) != (_cdiv(n, BLOCK), _cdiv(k, BLOCK)):
        raise ValueError(f"block scale {tuple(scale.shape)} does not fit weight {tuple(w_fp8.shape)}")
    return w_fp8.float() * expand_block_scale(scale.float(), n, k)


def quantize_act_group(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, K]`` -> ``(x_fp8 [T, K], scale [T, ceil(K/128)] fp32)``: one scale per token per 128 channels."""
    *lead, k = x.shape
    kb = _cdiv(k, BLOCK)
    a = x.detach().abs().float()
    if k % BLOCK:
        a = torch.nn.functional.pad(a, (0, kb * BLOCK - k))
    scale = _scale_from_amax(a.reshape(*lead, kb, BLOCK).amax(dim=-1))
    q = (x.float() / scale.repeat_interleave(BLOCK, dim=-1)[..., :k]).clamp_(-FP8_MAX, FP8_MAX)
    return q.to(FP8_DTYPE), scale


def dequantize_act_group(x_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x_fp8 [T, K], scale [T, ceil(K/128)])`` -> fp32 ``[T, K]``."""
    k = x_fp8.shape[-1]
    if scale.shape[-1] != _cdiv(k, BLOCK):
        raise ValueError(f"activation scale {tuple(scale.shape)} does not fit {tuple(x_fp8.shape)}")
    return x_fp8.float() * scale.float().repeat_interleave(BLOCK, dim=-1)[..., :k]
