"""KV pools: one tensor per pool holding K and V of every layer that uses the pool.

Layout of a pool tensor: ``[L, 2, NB, BS, Hkv, D]`` (L = layers of that kind, 2 = K/V). The K cache
of one layer is ``pool[i, 0]`` = ``[NB, BS, Hkv, D]``, contiguous, so block ``b`` of one layer and
kind is one contiguous byte range at ``data_ptr + ((i*2 + kind) * NB + b) * block_nbytes``.
Two pools: ``full`` (full-attention layers, every token) and ``sliding`` (sliding-window layers,
a small per-sequence ring of blocks). Works on host or device memory alike.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from dayzero.config import ModelConfig

KINDS = ("k", "v")


@dataclass(frozen=True)
class KVCacheSpec:
    """Everything two KV caches must agree on to exchange blocks."""

    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    window: int
    layer_types: tuple[str, ...]

    def __post_init__(self) -> None:
        bs = self.block_size
        if bs <= 0 or bs & (bs - 1):
            raise ValueError(f"KV block size must be a power of two, got {bs}")

    @classmethod
    def from_model(cls, cfg: ModelConfig, block_size: int = 16, dtype: torch.dtype = torch.bfloat16,
                   num_kv_heads: int | None = None) -> "KVCacheSpec":
        return cls(block_size=block_size, num_kv_heads=num_kv_heads or cfg.num_key_value_heads,
                   head_dim=cfg.head_dim, dtype=dtype, window=cfg.sliding_window, layer_types=tuple(cfg.layer_types))

    @property
    def full_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t != "sliding_attention"]

    @property
    def sliding_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "sliding_attention"]

    @property
    def ring_blocks(self) -> int:
        """R: blocks in a sliding layer's per-sequence ring; logical block j lives in ring[j % R]."""
        return math.ceil(self.window / self.block_size) + 1 if self.sliding_layers else 0

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block of one layer and kind (K or V)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.block_size * self.num_kv_heads * self.head_dim * elem

    def signature(self) -> str:
        """Stable text for a compatibility hash (layout + dtype + block size + ring)."""
        return (f"kv-v1 layout=[L,2,NB,BS,Hkv,D] bs={self.block_size} hkv={self.num_kv_heads} d={self.head_dim} "
                f"dtype={str(self.dtype).removeprefix('torch.')} window={self.window} ring={self.ring_blocks} "
                f"layers={','.join('s' if t == 'sliding_attention' else 'f' for t in self.layer_types)}")

    def signature_hash(self) -> str:
        return hashlib.sha256(self.signature().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class KVRegion:
    """One pool's memory as seen by a transport (register ``data_ptr``/``nbytes`` once)."""

    pool: str            # "full" | "sliding"
    data_ptr: int
    nbytes: int
    device: str          # "cpu" or "cuda:N"
    num_layers: int
    num_blocks: int
    block_nbytes: int


class KVPool:
    """The tensor ``[L, 2, NB, BS, Hkv, D]`` of one pool and the map model layer -> slot in it."""

    def __init__(self, name: str, spec: KVCacheSpec, layers: list[int], num_blocks: int,
                 device: torch.device | str = "cpu") -> None:
        self.name = name
        self.spec = spec
        self.layers = list(layers)
        self.slot = {layer: i for i, layer in enumerate(self.layers)}
        self.num_blocks = num_blocks
        shape = (len(self.layers), 2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        self.data = torch.zeros(shape, dtype=spec.dtype, device=device)

    def k(self, layer: int) -> torch.Tensor:   # [NB, BS, Hkv, D]
        return self.data[self.slot[layer], 0]

    def v(self, layer: int) -> torch.Tensor:   # [NB, BS, Hkv, D]
        return self.data[self.slot[layer], 1]

    def region(self) -> KVRegion:
        return KVRegion(pool=self.name, data_ptr=self.data.data_ptr(),
                        nbytes=self.data.numel() * self.data.element_size(), device=str(self.data.device),
                        num_layers=len(self.layers), num_blocks=self.num_blocks, block_nbytes=self.spec.block_nbytes)

    def block_address(self, layer: int, kind: str, block: int) -> int:
        """Address of one block of one layer and kind ("k" or "v")."""
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"{self.name} pool: block {block} out of range [0, {self.num_blocks})")
        idx = (self.slot[layer] * 2 + KINDS.index(kind)) * self.num_blocks + block
        return self.data.data_ptr() + idx * self.spec.block_nbytes
