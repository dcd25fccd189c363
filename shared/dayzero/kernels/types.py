"""Weight containers passed to kernel ops (one layout contract for every backend).

FP8 weights are float8_e4m3fn with one fp32 scale per 128x128 block (dequant = w * scale). Edge
blocks are partial (2880 = 22*128 + 64): the scale of a partial block covers only the real
rows/columns; nothing is padded in storage. A backend that wants padded or re-laid-out copies makes
them once and keeps them in ``derived`` (keyed by the backend's own names).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

BLOCK = 128  # FP8 weight block (rows and columns) and activation group size


@dataclass
class LinearWeight:
    weight: torch.Tensor                 # [N, K] (out, in): fp32/bf16, or float8_e4m3fn
    bias: torch.Tensor | None = None     # [N]
    scale: torch.Tensor | None = None    # [ceil(N/128), ceil(K/128)] fp32 when weight is fp8
    derived: dict = field(default_factory=dict)

    @property
    def is_fp8(self) -> bool:
        return self.weight.dtype == torch.float8_e4m3fn


@dataclass
class ExpertWeights:
    gate_up: torch.Tensor                # [E, 2I, H]; rows interleaved: gate = even rows, up = odd rows
    gate_up_bias: torch.Tensor           # [E, 2I]
    down: torch.Tensor                   # [E, H, I]
    down_bias: torch.Tensor              # [E, H]
    gate_up_scale: torch.Tensor | None = None  # [E, ceil(2I/128), ceil(H/128)] when fp8
    down_scale: torch.Tensor | None = None     # [E, ceil(H/128), ceil(I/128)] when fp8
    derived: dict = field(default_factory=dict)

    @property
    def is_fp8(self) -> bool:
        return self.gate_up.dtype == torch.float8_e4m3fn

    @property
    def num_experts(self) -> int:
        return self.gate_up.shape[0]

    def check_call(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> tuple[int, int, int, int]:
        """(T, H, E, I) of a call with x [T, H], routing weights / ids [T, k]; ValueError if they disagree."""
        T, H = x.shape
        E, two_i, h_in = self.gate_up.shape
        I = two_i // 2
        if h_in != H or self.down.shape != (E, H, I) or weights.shape != ids.shape or ids.shape[0] != T:
            raise ValueError(f"moe shapes disagree: x {tuple(x.shape)}, ids {tuple(ids.shape)}, weights "
                             f"{tuple(weights.shape)}, gate_up {tuple(self.gate_up.shape)}, "
                             f"down {tuple(self.down.shape)}")
        return T, H, E, I
