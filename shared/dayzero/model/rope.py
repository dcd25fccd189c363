"""YaRN rotary embedding tables, computed once per model (gpt-oss: theta 150000, factor 32,
original context 4096, beta_fast 32, beta_slow 1, truncate false, attention scaling on cos/sin).

The tables hold ``cos/sin(position * inv_freq) * attention_factor`` for every position up to
``max_positions`` as ``[P, D/2]`` fp32, i.e. exactly the values HF transformers computes per step
(same fp32 product ``position * inv_freq``), so gathering rows by position matches it bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dayzero.config import ModelConfig, RopeConfig


def yarn_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """YaRN inverse frequencies ``[D/2]`` fp32 and the attention factor (scales cos and sin)."""
    dim, base, factor = head_dim, rope.theta, rope.factor
    attention_factor = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(rope.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp                                              # [D/2]
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv_extra = 1.0 / pos_freqs
    inv_inter = 1.0 / (factor * pos_freqs)
    inv_freq = inv_inter * (1 - extrapolation_weight) + inv_extra * extrapolation_weight
    return inv_freq, attention_factor


@dataclass
class RopeTables:
    cos: torch.Tensor  # [P, D/2] fp32
    sin: torch.Tensor  # [P, D/2] fp32

    @property
    def max_positions(self) -> int:
        return self.cos.shape[0]

    def to(self, device: torch.device | str) -> "RopeTables":
        return RopeTables(self.cos.to(device), self.sin.to(device))


def build_rope_tables(cfg: ModelConfig, max_positions: int | None = None,
                      device: torch.device | str = "cpu") -> RopeTables:
    """cos/sin tables for positions ``[0, max_positions)`` (default: cfg.max_position_embeddings)."""
    P = cfg.max_position_embeddings if max_positions is None else max_positions
    inv_freq, attn_factor = yarn_inv_freq(cfg.rope, cfg.head_dim)
    pos = torch.arange(P, dtype=torch.int64).float()
    freqs = pos[:, None] * inv_freq[None, :]                                     # [P, D/2]
    return RopeTables(cos=(freqs.cos() * attn_factor).to(device), sin=(freqs.sin() * attn_factor).to(device))
