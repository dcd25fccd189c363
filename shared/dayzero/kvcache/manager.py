"""Paged KV cache: per-sequence block lists over the two pools, attention metadata, transfer views.

Full-attention layers: sequence s owns ``full[s]``, one block per ``block_size`` tokens (logical
block j -> ``full[s][j]``). Sliding-window layers: s owns a ring of at most R = ceil(window/BS)+1
blocks from the sliding pool; logical block j -> ``ring[s][j % R]``, so only the last ``window``
tokens are kept (older slots are overwritten). The same block ids serve every layer of a pool.
The attention op sees, for both kinds, a full-length block table ``[B, MB]`` (sliding rows repeat
the ring); ``store_kv`` slot mappings skip (-1) sliding positions older than the window.

Transfer: ``block_addresses(seq, n)`` lists the blocks that hold the first ``n`` tokens' KV (for
sliding layers only the ring slots of the last ``window`` tokens), each with a ``key`` that names
the same block on any peer with the same ``KVCacheSpec``: ("full", logical j) or ("ring", slot).
A sender and a receiver pair their lists by (layer, kind, key) and copy ``nbytes`` per pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .allocator import BlockAllocator, KVCacheFullError
from .pool import KVCacheSpec, KVPool, KVRegion


@dataclass
class SeqBlocks:
    full: list[int] = field(default_factory=list)   # physical ids, logical order
    ring: list[int] = field(default_factory=list)   # physical ids, ring-slot order (<= R)
    capacity: int = 0                                # tokens the blocks can hold


@dataclass(frozen=True)
class BlockAddress:
    layer: int
    kind: str                  # "k" | "v"
    key: tuple[str, int]       # ("full", logical block) | ("ring", ring slot)
    block: int                 # physical block id in its pool
    addr: int
    nbytes: int


class KVCacheManager:
    """Owns the pools, the allocators and every sequence's blocks (keyed by request id)."""

    def __init__(self, spec: KVCacheSpec, num_blocks: int, num_ring_blocks: int | None = None,
                 max_seqs: int = 256, device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.BS = spec.block_size
        self.R = spec.ring_blocks
        if num_ring_blocks is None:
            num_ring_blocks = max_seqs * self.R
        if not spec.sliding_layers:
            num_ring_blocks = 0
        self.full_pool = KVPool("full", spec, spec.full_layers, num_blocks if spec.full_layers else 0, device)
        self.ring_pool = KVPool("sliding", spec, spec.sliding_layers, num_ring_blocks, device)
        self.full_alloc = BlockAllocator(self.full_pool.num_blocks, "full-attention")
        self.ring_alloc = BlockAllocator(num_ring_blocks, "sliding-window")
        self.seqs: dict[str, SeqBlocks] = {}
        self._sliding = set(spec.sliding_layers)

    # ---- accounting ----------------------------------------------------------------------------
    def _needed(self, seq: SeqBlocks, num_tokens: int) -> tuple[int, int]:
        nblk = math.ceil(num_tokens / self.BS)
        full = max(0, nblk - len(seq.full)) if self.spec.full_layers else 0
        ring = max(0, min(nblk, self.R) - len(seq.ring)) if self.R else 0
        return full, ring

    def can_fit(self, seq_id: str | None, num_tokens: int) -> bool:
        seq = self.seqs.get(seq_id) if seq_id is not None else None
        f, r = self._needed(seq or SeqBlocks(), num_tokens)
        return self.full_alloc.can_allocate(f) and self.ring_alloc.can_allocate(r)

    def ensure(self, seq_id: str, num_tokens: int) -> SeqBlocks:
        """Make ``seq_id`` (created if new) hold ``num_tokens`` tokens; all-or-nothing."""
        seq = self.seqs.get(seq_id)
        new = seq is None
        seq = seq or SeqBlocks()
        f, r = self._needed(seq, num_tokens)
        if not (self.full_alloc.can_allocate(f) and self.ring_alloc.can_allocate(r)):
            raise KVCacheFullError(
                f"KV cache full for {seq_id!r} ({num_tokens} tokens): need {f} full-attention block(s) "
                f"({self.full_alloc.num_free} free) and {r} sliding block(s) ({self.ring_alloc.num_free} free)")
        seq.full += self.full_alloc.allocate(f)
        seq.ring += self.ring_alloc.allocate(r)
        seq.capacity = max(seq.capacity, num_tokens)
        if new:
            self.seqs[seq_id] = seq
        return seq

    def free(self, seq_id: str) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            return
        self.full_alloc.free(seq.full)
        self.ring_alloc.free(seq.ring)

    def has(self, seq_id: str) -> bool:
        return seq_id in self.seqs

    @property
    def num_free_blocks(self) -> int:
        return self.full_alloc.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.full_alloc.num_used + self.ring_alloc.num_used

    # ---- attention metadata --------------------------------------------------------------------
    def block_tables(self, seq_ids: list[str], num_tokens: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
        """(full [B, MB] int32, sliding [B, MB] int32) covering ``num_tokens[b]`` tokens of each sequence."""
        MB = max([math.ceil(n / self.BS) for n in num_tokens] + [1])
        full = torch.zeros(len(seq_ids), MB, dtype=torch.int32)
        slide = torch.zeros(len(seq_ids), MB, dtype=torch.int32)
        for b, (sid, n) in enumerate(zip(seq_ids, num_tokens)):
            seq = self.seqs[sid]
            nblk = math.ceil(n / self.BS)
            if seq.full:
                full[b, :nblk] = torch.tensor(seq.full[:nblk], dtype=torch.int32)
            if seq.ring:
                slide[b, :nblk] = torch.tensor([seq.ring[j % self.R] for j in range(nblk)], dtype=torch.int32)
        return full.to(device), slide.to(device)

    def slot_mappings(self, seq_ids: list[str], starts: list[int], counts: list[int],
                      device) -> tuple[torch.Tensor, torch.Tensor]:
        """(full [T], sliding [T]) int64 slots ``block*BS + offset`` for new tokens at positions
        ``starts[b] .. starts[b]+counts[b]-1``; sliding positions older than the window get -1."""
        full_s, ring_s = [], []
        W = self.spec.window
        for sid, s, c in zip(seq_ids, starts, counts):
            seq = self.seqs[sid]
            total = s + c
            if seq.capacity < total:
                raise RuntimeError(f"sequence {sid!r}: {total} tokens exceed the {seq.capacity} reserved")
            pos = torch.arange(s, total, dtype=torch.int64)
            j, off = pos // self.BS, pos % self.BS
            if seq.full:
                full_s.append(torch.tensor(seq.full, dtype=torch.int64)[j] * self.BS + off)
            else:
                full_s.append(torch.full_like(pos, -1))
            if seq.ring:
                slot = torch.tensor(seq.ring, dtype=torch.int64)[j % self.R] * self.BS + off
                ring_s.append(torch.where(pos >= total - W, slot, -1))
            else:
                ring_s.append(torch.full_like(pos, -1))
        empty = torch.zeros(0, dtype=torch.int64)
        return (torch.cat(full_s or [empty]).to(device), torch.cat(ring_s or [empty]).to(device))

    def layer_cache(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        pool = self.ring_pool if layer in self._sliding else self.full_pool
        return pool.k(layer), pool.v(layer)

    def is_sliding(self, layer: int) -> bool:
        return layer in self._sliding

    # ---- transfer views ------------------------------------------------------------------------
    def regions(self) -> list[KVRegion]:
        return [p.region() for p in (self.full_pool, self.ring_pool) if p.num_blocks and p.layers]

    def layer_tensors(self) -> list[tuple[int, str, torch.Tensor]]:
        """(layer, kind, tensor [NB, BS, Hkv, D]) for every layer and kind, e.g. to register with a transport."""
        out = []
        for layer in range(len(self.spec.layer_types)):
            k, v = self.layer_cache(layer)
            out += [(layer, "k", k), (layer, "v", v)]
        return out

    def layer_blocks(self, seq_id: str, num_tokens: int) -> list[list[int]]:
        """Per layer, the physical blocks holding tokens ``[0, num_tokens)`` in a peer-independent order
        (full: logical order; sliding: ring slots of the last ``window`` tokens, by logical block).
        Two caches with the same spec pair element i of layer l with element i of layer l."""
        per_layer: dict[int, list[int]] = {}
        for a in self.block_addresses(seq_id, num_tokens):
            if a.kind == "k":
                per_layer.setdefault(a.layer, []).append(a.block)
        return [per_layer.get(layer, []) for layer in range(len(self.spec.layer_types))]

    def block_addresses(self, seq_id: str, num_tokens: int) -> list[BlockAddress]:
        """Blocks holding the KV of tokens ``[0, num_tokens)`` of ``seq_id`` (see module docstring)."""
        seq = self.seqs[seq_id]
        if num_tokens > seq.capacity:
            raise ValueError(f"sequence {seq_id!r}: {num_tokens} tokens > {seq.capacity} reserved")
        nblk = math.ceil(num_tokens / self.BS)
        first_ring = max(0, num_tokens - self.spec.window) // self.BS
        out: list[BlockAddress] = []
        nb = self.spec.block_nbytes
        for layer in range(len(self.spec.layer_types)):
            for kind in ("k", "v"):
                if layer in self._sliding:
                    for j in range(first_ring, nblk):
                        b = seq.ring[j % self.R]
                        out.append(BlockAddress(layer, kind, ("ring", j % self.R), b,
                                                self.ring_pool.block_address(layer, kind, b), nb))
                else:
                    for j in range(nblk):
                        b = seq.full[j]
                        out.append(BlockAddress(layer, kind, ("full", j), b,
                                                self.full_pool.block_address(layer, kind, b), nb))
        return out
