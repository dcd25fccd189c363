"""Random paged-attention problems for the attention kernels' GPU tests and benchmarks (no triton needed).

A case holds new q/k/v for a ragged batch, a paged cache whose physical blocks are shuffled, and a
block table. Everything a correct kernel must never read is poisoned with NaN: unused cache blocks,
cache slots past each sequence's cached length, and (sliding layers) the blocks and slots below the
window, whose table entries point at a NaN block, as the engine's ring may leave them anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Case:
    q: torch.Tensor             # [T, Hq, D]
    k: torch.Tensor             # [T, Hkv, D]
    v: torch.Tensor             # [T, Hkv, D]
    k_cache: torch.Tensor       # [NB, BS, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, MB] int32
    cu_seqlens_q: torch.Tensor  # [B+1] int32
    cached_lens: torch.Tensor   # [B] int32
    sinks: torch.Tensor         # [Hq] float32
    scale: float
    window: int

    def args(self) -> tuple:
        return (self.q, self.k, self.v, self.k_cache, self.v_cache, self.block_tables,
                self.cu_seqlens_q, self.cached_lens, self.sinks, self.scale, self.window)


def make_sinks(hq: int, regime: str, gen: torch.Generator, device) -> torch.Tensor:
    """Sink logits: 'normal' N(0, 2), 'neg' (very negative, ~no sink), 'large' (sink dominates), 'mixed'."""
    base = torch.randn(hq, generator=gen) * 2.0
    if regime == "neg":
        base = -1.0e4 + base
    elif regime == "large":
        base = 25.0 + base
    elif regime == "mixed":
        choices = torch.tensor([-1.0e4, -30.0, 0.0, 8.0, 25.0])
        base = base + choices[torch.randint(0, len(choices), (hq,), generator=gen)]
    return base.float().to(device)


def make_case(q_lens: list[int], cached: list[int], hq: int = 64, hkv: int = 8, d: int = 64,
              bs: int = 16, window: int = 0, sinks: str = "normal", dtype=torch.bfloat16,
              device="cuda", seed: int = 0, extra_cols: int = 2, poison: bool = True) -> Case:
    gen = torch.Generator().manual_seed(seed)
    B = len(q_lens)
    T = sum(q_lens)
    need = [-(-(c + n) // bs) for c, n in zip(cached, q_lens)]  # blocks per sequence (cache + new)
    MB = max(need) + extra_cols
    NB = sum(need) + 3
    perm = torch.randperm(NB - 1, generator=gen) + 1            # block 0 is the NaN block
    tables = torch.zeros((B, MB), dtype=torch.int32)            # unused columns -> NaN block
    used = 0
    for b in range(B):
        tables[b, :need[b]] = perm[used:used + need[b]].to(torch.int32)
        used += need[b]
    shape_c = (NB, bs, hkv, d)
    k_cache = (torch.randn(shape_c, generator=gen)).to(dtype)
    v_cache = (torch.randn(shape_c, generator=gen)).to(dtype)
    if poison:
        valid = torch.zeros((NB, bs), dtype=torch.bool)
        for b in range(B):
            first = max(0, cached[b] - window + 1) if window > 0 else 0   # oldest key any new query sees
            for j in range(first // bs, need[b]):
                lo = max(first - j * bs, 0)
                hi = min(cached[b] - j * bs, bs)
                if hi > lo:
                    valid[tables[b, j], lo:hi] = True
            if window > 0:
                tables[b, :first // bs] = 0
        k_cache[~valid] = float("nan")
        v_cache[~valid] = float("nan")
    q = torch.randn((T, hq, d), generator=gen).to(dtype)
    k = torch.randn((T, hkv, d), generator=gen).to(dtype)
    v = torch.randn((T, hkv, d), generator=gen).to(dtype)
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    to = lambda t: t.to(device)  # noqa: E731
    return Case(q=to(q), k=to(k), v=to(v), k_cache=to(k_cache), v_cache=to(v_cache),
                block_tables=to(tables), cu_seqlens_q=to(cu), cached_lens=to(torch.tensor(cached, dtype=torch.int32)),
                sinks=make_sinks(hq, sinks, gen, device), scale=d ** -0.5, window=window)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def seq_errors(out: torch.Tensor, ref: torch.Tensor, cu: torch.Tensor) -> list[float]:
    """Relative error per sequence (so a short sequence cannot hide behind a long one)."""
    c = cu.tolist()
    return [rel_err(out[c[i]:c[i + 1]], ref[c[i]:c[i + 1]]) for i in range(len(c) - 1) if c[i + 1] > c[i]]


def check_output(res: torch.Tensor, out: torch.Tensor, ref: torch.Tensor, cu: torch.Tensor, tol: float) -> list[float]:
    """What every attention kernel test asserts of a call into a NaN-poisoned ``out``: it returned ``out``,
    wrote every element, and each sequence is within ``tol`` of ``ref``. Returns the per-sequence errors."""
    assert res is out
    assert not out.isnan().any(), "some output elements were never written (or NaN leaked in)"
    errs = seq_errors(out, ref, cu)
    assert max(errs) < tol, errs
    return errs
