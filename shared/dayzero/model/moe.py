"""MoE block of gpt-oss: a dense router (top-k logits, softmax over those k) and routed experts with
the clamped SwiGLU; experts may be placed on EP ranks (each rank holds a contiguous slice)."""

from __future__ import annotations

import math

import torch
from torch import nn

from dayzero.config import ModelConfig
from dayzero.kernels.registry import Ops
from dayzero.kernels.types import BLOCK, ExpertWeights

from .layers import FP8, Linear, ParallelConfig, Precision, WeightLoadError, load_dense_or_fp8


class Experts(nn.Module):
    """The expert tensors of one layer in the canonical (out, in) layout; EP rank r holds experts
    ``[r*E/ep, (r+1)*E/ep)``. Parameter names follow the canonical checkpoint names."""

    def __init__(self, cfg: ModelConfig, layer: int, prec: Precision, par: ParallelConfig, device) -> None:
        super().__init__()
        E, H, I = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
        if E % par.ep_size:
            raise ValueError(f"{E} experts cannot be split over EP={par.ep_size}")
        self.pre = f"model.layers.{layer}.mlp.experts"
        self.num_global = E
        self.num_local = El = E // par.ep_size
        self.offset = par.ep_rank * El
        wdt = FP8 if prec.fp8 else prec.act

        def p(shape, dtype):
            return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)

        self.gate_up_proj = p((El, 2 * I, H), wdt)
        self.gate_up_proj_bias = p((El, 2 * I), prec.act)
        self.down_proj = p((El, H, I), wdt)
        self.down_proj_bias = p((El, H), prec.act)
        self.gate_up_proj_scale = p((El, math.ceil(2 * I / BLOCK), math.ceil(H / BLOCK)), torch.float32) if prec.fp8 else None
        self.down_proj_scale = p((El, math.ceil(H / BLOCK), math.ceil(I / BLOCK)), torch.float32) if prec.fp8 else None
        shapes = {"gate_up_proj": (E, 2 * I, H), "down_proj": (E, H, I)}
        for wname, full in shapes.items():
            getattr(self, wname).weight_loader = self._weight_loader(wname, full)
        for bname, full in {"gate_up_proj_bias": (E, 2 * I), "down_proj_bias": (E, H)}.items():
            getattr(self, bname).weight_loader = self._bias_loader(bname, full)
        self.weights = ExpertWeights(
            gate_up=self.gate_up_proj.data, gate_up_bias=self.gate_up_proj_bias.data, down=self.down_proj.data,
            down_bias=self.down_proj_bias.data,
            gate_up_scale=None if self.gate_up_proj_scale is None else self.gate_up_proj_scale.data,
            down_scale=None if self.down_proj_scale is None else self.down_proj_scale.data,
            derived={"expert_offset": self.offset})

    def _weight_loader(self, wname: str, full: tuple[int, ...]):
        def load(loaded: torch.Tensor, scale: torch.Tensor | None = None) -> None:
            load_dense_or_fp8(f"{self.pre}.{wname}", getattr(self, wname), getattr(self, wname + "_scale"),
                              loaded, scale, full, (0, self.offset // self.num_local, self.num_global // self.num_local))
        return load

    def _bias_loader(self, bname: str, full: tuple[int, ...]):
        def load(loaded: torch.Tensor, scale: torch.Tensor | None = None) -> None:
            if tuple(loaded.shape) != full:
                raise WeightLoadError(f"tensor {self.pre}.{bname}: shape {list(loaded.shape)} does not match "
                                      f"the model's {list(full)}")
            dst = getattr(self, bname)
            dst.data.copy_(loaded[self.offset:self.offset + self.num_local].to(dst.device, dst.dtype))
        return load


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, prec: Precision, par: ParallelConfig, device) -> None:
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.limit = cfg.swiglu_limit
        self.par = par
        # router: never quantized; bf16 in bf16/FP8 models (its top-k softmax then runs in bf16)
        self.router = Linear(f"model.layers.{layer}.mlp.router", cfg.hidden_size, cfg.num_local_experts, True,
                             prec.act, False, device)
        self.experts = Experts(cfg, layer, prec, par, device)

    def forward(self, ops: Ops, x: torch.Tensor) -> torch.Tensor:
        """x: normalized hidden ``[T, H]`` (replicated on every rank) -> ``[T, H]`` (summed over EP ranks)."""
        logits = ops.linear(x, self.router.lw)                       # [T, E]
        weights, ids = ops.router_topk(logits, self.top_k)           # [T, k], [T, k]
        y = ops.moe_experts(x, weights, ids, self.experts.weights, self.limit)
        if self.par.ep_size > 1:  # each rank summed only its experts' routes (TP-only dispatch)
            self.par.reduce(y)
        return y
