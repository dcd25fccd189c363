"""Engine building blocks whose parameters load themselves (nano-vllm style).

Every parameter carries ``param.weight_loader(loaded, scale=None)``: it checks the shape, takes
this rank's shard (tensor parallel), converts the dtype, quantizes to FP8 (128x128 blocks) when the
parameter is FP8 and the source is not, or dequantizes when the source is FP8 and the parameter is
not, and copies in place. ``scale`` is the fp32 block scale of an FP8 source tensor.
Modules are built directly on their device and never moved afterwards: the ``LinearWeight`` and
``ExpertWeights`` handed to kernel ops are views of the parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from dayzero.kernels.types import BLOCK, LinearWeight

FP8 = torch.float8_e4m3fn


class WeightLoadError(ValueError):
    """A tensor that does not fit its parameter; the message names the tensor."""


@dataclass(frozen=True)
class Precision:
    """``float32`` | ``bfloat16`` | ``fp8`` (FP8 block-scaled linears/experts, bf16 everything else)."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in ("float32", "bfloat16", "fp8"):
            raise ValueError(f"unknown dtype {self.name!r}; choose float32, bfloat16 or fp8")

    @property
    def act(self) -> torch.dtype:
        return torch.float32 if self.name == "float32" else torch.bfloat16

    @property
    def fp8(self) -> bool:
        return self.name == "fp8"


@dataclass(frozen=True)
class ParallelConfig:
    """Where this process sits: TP splits heads and dense projections, EP places experts.
    ``all_reduce(x)`` sums a tensor in place over the group of ranks (one group holds the TP and
    the EP split of a worker, as in the seed's "TP-only" dispatch); None when alone."""

    tp_rank: int = 0
    tp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    all_reduce: Callable[[torch.Tensor], None] | None = None

    def __post_init__(self) -> None:
        world = max(self.tp_size, self.ep_size)
        if self.tp_size not in (1, world) or self.ep_size not in (1, world):
            raise ValueError(f"TP={self.tp_size} with EP={self.ep_size}: each must be 1 or the group size {world}")
        if not (0 <= self.tp_rank < self.tp_size and 0 <= self.ep_rank < self.ep_size):
            raise ValueError(f"rank out of range: tp {self.tp_rank}/{self.tp_size}, ep {self.ep_rank}/{self.ep_size}")
        if world > 1 and self.all_reduce is None:
            raise ValueError(f"TP={self.tp_size}/EP={self.ep_size} needs an all_reduce")

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the group in place (callers reduce only what is split: TP for attention,
        EP for experts)."""
        if self.all_reduce is not None:
            self.all_reduce(x)
        return x


def _param(shape, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def _check_shape(name: str, got: torch.Size, want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise WeightLoadError(f"tensor {name}: shape {list(got)} does not match the model's {list(want)}")


def _fp8mod():
    from dayzero.weights import fp8

    return fp8


def load_dense_or_fp8(name: str, dst: nn.Parameter, dst_scale: nn.Parameter | None, loaded: torch.Tensor,
                      scale: torch.Tensor | None, full_shape: tuple[int, ...], shard: tuple[int, int, int] | None) -> None:
    """Copy ``loaded`` (full tensor, shape ``full_shape``) into ``dst`` (+ ``dst_scale`` when FP8).

    shard = (dim, rank, size): take slice ``rank`` of ``size`` along ``dim`` (dim counted from the end
    is not allowed). FP8 sources must shard on 128-block boundaries.
    """
    _check_shape(name, loaded.shape, full_shape)
    src_fp8 = loaded.dtype == FP8
    if src_fp8 and scale is None:
        raise WeightLoadError(f"tensor {name}: float8 tensor without its {name}_scale companion")
    if src_fp8:
        want = tuple(math.ceil(s / BLOCK) for s in full_shape[-2:])
        _check_shape(f"{name}_scale", scale.shape, tuple(full_shape[:-2]) + want)
    if shard is not None and shard[2] > 1:
        dim, rank, size = shard
        n = full_shape[dim] // size
        if src_fp8:
            if n % BLOCK and dim >= len(full_shape) - 2:
                raise WeightLoadError(f"tensor {name}: shard of {n} along dim {dim} is not a multiple of {BLOCK}")
            if dim >= len(full_shape) - 2:
                scale = scale.narrow(dim, rank * n // BLOCK, n // BLOCK)
            else:
                scale = scale.narrow(dim, rank * n, n)
        loaded = loaded.narrow(dim, rank * n, n)
    if dst.dtype == FP8:
        if src_fp8:
            q, s = loaded, scale
        else:
            q, s = _fp8mod().quantize_weight_block(loaded.to(dst.device, torch.float32))
        dst.data.copy_(q.to(dst.device))
        dst_scale.data.copy_(s.to(dst.device, torch.float32))
    else:
        if src_fp8:
            loaded = _fp8mod().dequantize_weight_block(loaded, scale)
        dst.data.copy_(loaded.to(dst.device, dst.dtype))


class Linear(nn.Module):
    """``y = x W^T + b`` with W ``[N, K]``; FP8 block-scaled when ``fp8``.

    tp = (mode, rank, size): mode "column" shards N (outputs), "row" shards K (inputs; the caller
    all-reduces, and only rank 0 adds the bias); None = replicated.
    """

    def __init__(self, name: str, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 fp8: bool, device, tp: tuple[str, int, int] | None = None) -> None:
        super().__init__()
        self.name = name
        self.full_shape = (out_features, in_features)
        mode, rank, size = tp or ("none", 0, 1)
        self.tp = (mode, rank, size)
        N = out_features // size if mode == "column" else out_features
        K = in_features // size if mode == "row" else in_features
        self.weight = _param((N, K), FP8 if fp8 else dtype, device)
        self.weight_scale = _param((math.ceil(N / BLOCK), math.ceil(K / BLOCK)), torch.float32, device) if fp8 else None
        self.bias = _param((N,), dtype, device) if bias else None
        self.weight.weight_loader = self._load_weight
        if self.bias is not None:
            self.bias.weight_loader = self._load_bias
        self.lw = LinearWeight(weight=self.weight.data, bias=None if self.bias is None else self.bias.data,
                               scale=None if self.weight_scale is None else self.weight_scale.data)

    def _shard(self) -> tuple[int, int, int] | None:
        mode, rank, size = self.tp
        if size == 1 or mode == "none":
            return None
        return (0 if mode == "column" else 1, rank, size)

    def _load_weight(self, loaded: torch.Tensor, scale: torch.Tensor | None = None) -> None:
        load_dense_or_fp8(self.name + ".weight", self.weight, self.weight_scale, loaded, scale, self.full_shape,
                          self._shard())

    def _load_bias(self, loaded: torch.Tensor, scale: torch.Tensor | None = None) -> None:
        mode, rank, size = self.tp
        _check_shape(self.name + ".bias", loaded.shape, (self.full_shape[0],))
        if mode == "column" and size > 1:
            n = self.full_shape[0] // size
            loaded = loaded.narrow(0, rank * n, n)
        elif mode == "row" and rank > 0:
            loaded = torch.zeros_like(loaded)  # the bias is added once across the all-reduce
        self.bias.data.copy_(loaded.to(self.bias.device, self.bias.dtype))


def stack_column_linears(linears: list[Linear]) -> LinearWeight | None:
    """Re-point the parameters of linears that share their input onto one storage, rows stacked in
    the given order, and return the ``LinearWeight`` of the stack (one GEMM instead of several; the
    parameters and their loaders stay as they are, so checkpoints load unchanged).

    None (nothing changed) when they cannot share: different K, dtype, bias presence or device, or FP8
    parts whose rows are not whole 128-row scale blocks (e.g. k/v under TP 8)."""
    first = linears[0].weight
    K, fp8 = first.shape[1], first.dtype == FP8
    has_bias = linears[0].bias is not None
    for lin in linears:
        w = lin.weight
        if (w.shape[1] != K or w.dtype != first.dtype or w.device != first.device
                or (lin.bias is not None) != has_bias or (fp8 and w.shape[0] % BLOCK)):
            return None
    N = sum(lin.weight.shape[0] for lin in linears)
    weight = torch.empty((N, K), dtype=first.dtype, device=first.device)
    scale = torch.empty((N // BLOCK, math.ceil(K / BLOCK)), dtype=torch.float32, device=first.device) if fp8 else None
    bias = torch.empty((N,), dtype=linears[0].bias.dtype, device=first.device) if has_bias else None
    r0 = 0
    for lin in linears:
        r1 = r0 + lin.weight.shape[0]
        weight[r0:r1].copy_(lin.weight.data)
        lin.weight.data = weight[r0:r1]                  # the loader's in-place copy now fills the stack
        if fp8:
            scale[r0 // BLOCK:r1 // BLOCK].copy_(lin.weight_scale.data)
            lin.weight_scale.data = scale[r0 // BLOCK:r1 // BLOCK]
        if has_bias:
            bias[r0:r1].copy_(lin.bias.data)
            lin.bias.data = bias[r0:r1]
        lin.lw = LinearWeight(weight=lin.weight.data, bias=None if bias is None else lin.bias.data,
                              scale=None if scale is None else lin.weight_scale.data)
        r0 = r1
    return LinearWeight(weight=weight, bias=bias, scale=scale)


def load_plain(name: str, dst: nn.Parameter, loaded: torch.Tensor, shard: tuple[int, int, int] | None = None) -> None:
    """Loader for an unquantized parameter (norms, sinks, router, embeddings)."""
    full = list(dst.shape)
    if shard is not None and shard[2] > 1:
        full[shard[0]] *= shard[2]
    _check_shape(name, loaded.shape, tuple(full))
    if shard is not None and shard[2] > 1:
        dim, rank, size = shard
        n = full[dim] // size
        loaded = loaded.narrow(dim, rank * n, n)
    if loaded.dtype == FP8:
        raise WeightLoadError(f"tensor {name}: unexpected float8 tensor (this parameter is never quantized)")
    dst.data.copy_(loaded.to(dst.device, dst.dtype))


def plain_param(name: str, shape, dtype, device, shard: tuple[int, int, int] | None = None) -> nn.Parameter:
    p = _param(shape, dtype, device)
    p.weight_loader = lambda loaded, scale=None: load_plain(name, p, loaded, shard)
    return p


class RMSNorm(nn.Module):
    def __init__(self, name: str, hidden: int, eps: float, device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = plain_param(name + ".weight", (hidden,), torch.float32, device)  # fp32 as HF keeps it
