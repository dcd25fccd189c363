"""Persistent ("stream") fused MoE for the smallest decode batches (T <= 16 tokens): two launches.

``MoeStream`` allocates the buffers of one call and launches ``gate_up_stream_kernel`` and
``down_stream_kernel`` (read ``triton_moe_small_stream_kernels`` for the algorithm): a fixed grid of
a few programs per SM, each streaming one contiguous range of the flattened (expert, N tile, K
block) list, so a program pays its prologue and ticket epilogue once instead of once per 3-8 K
blocks as in the split-K path (``triton_moe_small_split``). bf16 activations, FP8 experts with
128x128 block scales, expert parallel through ``experts.derived["expert_offset"]``, static shapes
for a given T, no host syncs (CUDA-graph capturable), bitwise repeatable (partials summed in a fixed
order).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from .triton_moe_gemm import interpreting
from .triton_moe_small_split import BK, SWIGLU_ALPHA, _tickets
from .triton_moe_small_stream_kernels import down_stream_kernel, gate_up_stream_kernel
from .types import ExpertWeights


@dataclass(frozen=True)
class StreamTiles:
    """Launch configuration. ``programs``: grid size of both kernels (0: ``per_sm`` x the SM count)."""

    bn_gate_up: int = 64
    bn_down: int = 64
    per_sm: int = 4          # programs per SM (both kernels)
    programs: int = 0
    maxnreg: int = 0         # register cap per thread (0: none)
    bm: int = 16             # M block: the path takes T <= bm (every expert's tokens in one block)
    warps: int = 4
    stages: int = 4
    h16: bool = True         # h in fp16 (see triton_moe_small_split_kernels)


# Candidates (GPU tests check each; bench/moe/bench_small.py times each as ``stream_<name>``).
# sm_90 compile at T = 1 (bench/moe/compile_check_small.py stream_*): bn64 gate_up 235 / down 168
# registers uncapped (2 / 3 programs per SM); capped at 128: 4 per SM, 34 / 6 spill instructions (K
# loop 301 -> 307 instructions); bn128 250 / 234 (2 per SM, 16 KB of weights per K step).
VARIANTS = {
    "s64": StreamTiles(maxnreg=128),
    "s64_p2": StreamTiles(per_sm=2),
    "s128_p2": StreamTiles(bn_gate_up=128, bn_down=128, per_sm=2),
}
# Not yet measured on the GPU: the registered op keeps the split-K path until a device run
# (bench/NOTES.md "MoE decode run 6") sets where this one is faster. DAYZERO_MOE_STREAM_MAX_PAIRS
# overrides it (the device call's GPU tests run the registered op with the candidate value).
STREAM_MAX_PAIRS = int(os.environ.get("DAYZERO_MOE_STREAM_MAX_PAIRS", "0"))


def takes_stream(pairs: int, T: int) -> bool:
    """Whether the registered op runs a call with ``pairs`` = T * k pairs here."""
    return 0 < pairs <= STREAM_MAX_PAIRS and T <= StreamTiles.bm


def default_tiles(pairs: int) -> StreamTiles:
    """Default launch configuration for a call with ``pairs`` = T * k pairs."""
    return VARIANTS["s64"]


def _sm_count(dev: torch.device) -> int:
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4


def max_contributors(n_tiles: int, nkb: int, programs: int) -> int:
    """Most programs whose K ranges cover one tile (at least one slot touched: per >= its minimum)."""
    per_min = triton.cdiv(n_tiles * nkb, programs)
    return min(nkb, triton.cdiv(nkb - 1, per_min) + 1)


class MoeStream:
    """One decode MoE call: buffers allocated here, stages re-runnable on them (``STAGES``);
    ``__call__`` runs them in order and returns out [T, H]."""

    STAGES = ("gate_up", "down")

    def __init__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                 limit: float, tiles: StreamTiles | None = None) -> None:
        T, H, E, I = experts.check_call(x, weights, ids)
        if experts.gate_up_scale is None or experts.down_scale is None:
            raise ValueError("the stream MoE path needs fp8 experts with gate_up_scale and down_scale")
        if x.dtype != torch.bfloat16:
            raise ValueError(f"the stream MoE path takes bf16 activations, got {x.dtype}")
        self.tiles = t = tiles or default_tiles(T * ids.shape[1])
        for bn in (t.bn_gate_up, t.bn_down):
            if bn < 16 or 128 % bn:
                raise ValueError(f"N tile {bn} must divide 128 and be >= 16")
        if T > t.bm:
            raise ValueError(f"the stream MoE path takes at most {t.bm} tokens, got {T}")
        self.T, self.H, self.I, self.E, self.k = T, H, I, E, ids.shape[1]
        self.x, self.ids, self.weights, self.ex, self.limit = (x.contiguous(), ids.contiguous(),
                                                               weights.contiguous(), experts, float(limit))
        self.offset = int(experts.derived.get("expert_offset", 0))
        self.P, dev = T * self.k, x.device
        self.G = t.programs or t.per_sm * _sm_count(dev)
        self.nt1, self.nt2 = triton.cdiv(2 * I, t.bn_gate_up), triton.cdiv(H, t.bn_down)
        self.pb = max(16, triton.next_power_of_2(self.P))
        c1 = max_contributors(self.nt1, triton.cdiv(H, BK), self.G)
        c2 = max_contributors(self.nt2, triton.cdiv(I, BK), self.G)
        n1, n2 = self.P * self.nt1, self.P * self.nt2 + self.nt2
        tickets = _tickets(experts, n1 + n2, dev, "stream_")
        self.tickets1, self.tickets2 = tickets[:n1], tickets[n1:]
        self.ws1 = torch.empty((c1, self.P, 2 * I), dtype=torch.float32, device=dev)   # per covering program
        self.ws2 = torch.empty((c2, self.P, H), dtype=torch.float32, device=dev)
        self.h = torch.empty((self.P, I), dtype=torch.float16 if t.h16 else torch.bfloat16, device=dev)
        self.y = torch.empty((self.P, H), dtype=torch.float32, device=dev)                # per pair
        self.out = torch.empty((T, H), dtype=x.dtype, device=dev)
        self.launch = dict(TOPK=self.k, BM=t.bm, BK_=BK, PB=self.pb, DOT_F32=interpreting(), num_warps=t.warps,
                           num_stages=t.stages, **({"maxnreg": t.maxnreg} if t.maxnreg and not interpreting() else {}))

    def gate_up(self) -> None:
        ex, t = self.ex, self.tiles
        w, s, b = ex.gate_up, ex.gate_up_scale, ex.gate_up_bias
        gate_up_stream_kernel[(self.G,)](
            self.x, self.ids, w, s, b, self.h, self.ws1, self.tickets1, self.H, 2 * self.I, self.nt1, self.P,
            self.offset, self.E, self.x.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), b.stride(0),
            self.h.stride(0), self.limit, SWIGLU_ALPHA, BN=t.bn_gate_up, EVEN_N=(2 * self.I) % t.bn_gate_up == 0,
            **self.launch)

    def down(self) -> None:
        ex, t = self.ex, self.tiles
        w, s, b = ex.down, ex.down_scale, ex.down_bias
        down_stream_kernel[(self.G,)](
            self.h, self.ids, self.weights, w, s, b, self.y, self.ws2, self.out, self.tickets2, self.T, self.I,
            self.H, self.nt2, self.P, self.offset, self.E, self.h.stride(0), w.stride(0), w.stride(1), s.stride(0),
            s.stride(1), b.stride(0), self.out.stride(0), BN=t.bn_down, EVEN_N=self.H % t.bn_down == 0,
            H16=t.h16, **self.launch)

    def __call__(self) -> torch.Tensor:
        if self.T:
            self.gate_up()
            self.down()
        return self.out


def moe_stream(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
               limit: float, tiles: StreamTiles | None = None) -> torch.Tensor:
    """x [T, H] bf16 (T <= 16), weights/ids [T, k], fp8 experts -> [T, H] bf16."""
    return MoeStream(x, weights, ids, experts, limit, tiles)()
