"""The floor of a T = 1 decode MoE layer on this GPU: what two launches cost with no work, and how fast
a pure read of the same weight bytes goes with the same grid shape (``bench_small.py`` runs
``floor(res)`` as its first section; rows ``section=floor``).

A T = 1 call of the default (k1) tiles is two launches: gate_up, 720 programs = 4 experts x 180 tiles
of 32 rows x the whole K (2880 B per row, 128 B per row per K step), and down, 736 programs = 4 x 23
tiles of 128 rows x 8 K ranges of 3 blocks. Measured here, inside CUDA graphs of R calls that each
read 4 different experts (the routings of ``bench_small.routings``: no L2 reuse between calls):
  * ``empty_pair``: the two launches with the same grids, programs that return at once;
  * ``stream_*``: each program reads its weight tile (as int32 words, one xor per word: no
    conversion, no dot) in the kernel's order (``tile``: 128 B per row per step, ``U`` steps in
    flight) or as one contiguous run (``linear``: 4 KB steps; a 32-row full-K tile is contiguous);
    gate_up alone, down alone, the pair (two launches) and both in one launch.
Bytes: the FP8 weights only (the block scales and biases the real kernel also reads are 0.1 %).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def empty_kernel(x_ptr):
    pass


@triton.jit
def _tile_xor(w_ptr, ids_ptr, pid, n_tiles, KW, stride_e, stride_n, BN: tl.constexpr, BKW: tl.constexpr,
              SPLIT: tl.constexpr, U: tl.constexpr, LINEAR: tl.constexpr):
    """xor of every int32 word of program pid's tile (slot, N tile, K range): expert ids[slot]."""
    ks = pid % SPLIT
    pid_n = (pid // SPLIT) % n_tiles
    s = pid // (SPLIT * n_tiles)
    e = tl.load(ids_ptr + s).to(tl.int64)
    base = w_ptr + e * stride_e + (pid_n * BN).to(tl.int64) * stride_n
    if LINEAR:  # the tile's BN full rows are one contiguous run of BN * KW words (SPLIT == 1)
        offs = tl.arange(0, BN * BKW)
        acc = tl.zeros((BN * BKW,), dtype=tl.int32)
        n = BN * KW
        for i in range(0, tl.cdiv(n, U * BN * BKW)):
            for u in tl.static_range(U):
                o = (i * U + u) * (BN * BKW) + offs
                acc ^= tl.load(base + o, mask=o < n, other=0)
        return tl.xor_sum(acc, 0)
    else:
        nkb = tl.cdiv(KW, BKW)
        per = tl.cdiv(nkb, SPLIT)
        kb0 = ks * per
        kb1 = tl.minimum(kb0 + per, nkb)
        cols = tl.arange(0, BKW)
        ptrs = base + tl.arange(0, BN)[:, None].to(tl.int64) * stride_n + cols[None, :]
        acc = tl.zeros((BN, BKW), dtype=tl.int32)
        for kb in range(kb0, kb1, U):
            for u in tl.static_range(U):
                k = (kb + u) * BKW
                acc ^= tl.load(ptrs + k, mask=((k + cols) < KW)[None, :] & (kb + u < kb1), other=0)
        return tl.xor_sum(tl.xor_sum(acc, 1), 0)


@triton.jit
def stream_kernel(w1_ptr, w2_ptr, ids_ptr, out_ptr, n_first, n_tiles1, n_tiles2, KW1, KW2, stride_e1, stride_n1,
                  stride_e2, stride_n2, BN1: tl.constexpr, BN2: tl.constexpr, BKW: tl.constexpr,
                  SPLIT1: tl.constexpr, SPLIT2: tl.constexpr, U: tl.constexpr, LINEAR: tl.constexpr,
                  PART: tl.constexpr):
    """PART 0: every program reads a tile of w1 (gate_up shape); 1: of w2 (down shape); 2: programs
    [0, n_first) w1, the rest w2 (one launch; its registers are the larger branch's)."""
    pid = tl.program_id(0)
    if PART == 0:
        v = _tile_xor(w1_ptr, ids_ptr, pid, n_tiles1, KW1, stride_e1, stride_n1, BN1, BKW, SPLIT1, U, LINEAR)
    elif PART == 1:
        v = _tile_xor(w2_ptr, ids_ptr, pid, n_tiles2, KW2, stride_e2, stride_n2, BN2, BKW, SPLIT2, U, LINEAR)
    elif pid < n_first:
        v = _tile_xor(w1_ptr, ids_ptr, pid, n_tiles1, KW1, stride_e1, stride_n1, BN1, BKW, SPLIT1, U, LINEAR)
    else:
        v = _tile_xor(w2_ptr, ids_ptr, pid - n_first, n_tiles2, KW2, stride_e2, stride_n2, BN2, BKW, SPLIT2, U,
                      LINEAR)
    tl.store(out_ptr + pid, v)


class StreamRead:
    """One call's weight read: ``part`` 'gate_up', 'down', 'pair' (two launches) or 'one' (one launch)."""

    def __init__(self, ex, ids: torch.Tensor, part: str, U: int = 4, linear: bool = False,
                 bn1: int = 32, bn2: int = 128, split2: int = 8) -> None:
        self.w1 = ex.gate_up.view(torch.int32)   # [E, 2I, H/4]
        self.w2 = ex.down.view(torch.int32)      # [E, H, I/4]
        self.ids = ids.reshape(-1).contiguous()
        self.slots = self.ids.numel()
        self.part, self.U, self.linear = part, U, linear
        self.bn1, self.bn2, self.split2 = bn1, bn2, 1 if linear else split2
        self.nt1 = triton.cdiv(self.w1.shape[1], bn1)
        self.nt2 = triton.cdiv(self.w2.shape[1], bn2)
        self.g1 = self.slots * self.nt1
        self.g2 = self.slots * self.nt2 * self.split2
        self.out = torch.empty((self.g1 + self.g2,), dtype=torch.int32, device=ids.device)

    @property
    def bytes(self) -> int:
        per1 = self.w1[0].numel() * 4
        per2 = self.w2[0].numel() * 4
        return self.slots * ({"gate_up": per1, "down": per2}.get(self.part, per1 + per2))

    def _launch(self, part: int, grid: int, out: torch.Tensor) -> None:
        w1, w2 = self.w1, self.w2
        stream_kernel[(grid,)](w1, w2, self.ids, out, self.g1, self.nt1, self.nt2, w1.shape[2], w2.shape[2],
                               w1.stride(0), w1.stride(1), w2.stride(0), w2.stride(1), BN1=self.bn1, BN2=self.bn2,
                               BKW=32, SPLIT1=1, SPLIT2=self.split2, U=self.U, LINEAR=self.linear, PART=part,
                               num_warps=4)

    def __call__(self) -> None:
        if self.part in ("gate_up", "pair"):
            self._launch(0, self.g1, self.out)
        if self.part in ("down", "pair"):
            self._launch(1, self.g2, self.out[self.g1:])
        if self.part == "one":
            self._launch(2, self.g1 + self.g2, self.out)


class EmptyPair:
    """Two launches of a kernel that does nothing, with the given grids."""

    def __init__(self, grids: tuple[int, int], dev) -> None:
        self.grids = grids
        self.buf = torch.empty((1,), dtype=torch.int32, device=dev)

    def __call__(self) -> None:
        for g in self.grids:
            empty_kernel[(g,)](self.buf)


# (part, U, linear, down rows per tile, down K ranges): k1's shapes, the unsplit down candidates
# (d32: 360 programs, d16: 720), and contiguous runs (down 16 rows x full K: 720 programs)
CASES = [("gate_up", 1, False, 128, 8), ("gate_up", 4, False, 128, 8), ("down", 1, False, 128, 8),
         ("down", 4, False, 128, 8), ("down", 4, False, 32, 1), ("down", 4, False, 16, 1),
         ("pair", 4, False, 128, 8), ("one", 4, False, 128, 8), ("pair", 4, False, 16, 1),
         ("gate_up", 4, True, 16, 1), ("down", 4, True, 16, 1), ("pair", 4, True, 16, 1), ("one", 4, True, 16, 1)]


def compile_all(ex, ids: torch.Tensor) -> None:
    """Run every floor kernel once (fills Triton's cache; ``bench_small`` does it in a worker)."""
    EmptyPair((1, 1), ids.device)()
    for part, U, linear, bn2, split2 in CASES:
        StreamRead(ex, ids, part, U, linear, bn2=bn2, split2=split2)()


def floor(res, ex, routes: list, graph_us, copy_tbs: float) -> None:
    """Rows ``section=floor`` for the T = 1 routings ``routes`` [(weights, ids)] on experts ``ex``."""
    ids_list = [ids for _, ids in routes]
    dev = ids_list[0].device
    for grids in ((720, 736), (1, 1)):
        res.add(section="floor", name=f"empty_pair_{grids[0]}_{grids[1]}",
                us=graph_us([EmptyPair(grids, dev) for _ in ids_list]))
    for part, U, linear, bn2, split2 in CASES:
        runs = [StreamRead(ex, ids, part, U, linear, bn2=bn2, split2=split2) for ids in ids_list]
        us = graph_us(runs)
        mb = runs[0].bytes / 1e6
        order = "linear" if linear else "tile"
        res.add(section="floor", name=f"stream_{part}_{order}_u{U}_d{bn2}s{split2}", part=part, U=U, order=order,
                grid=[runs[0].g1, runs[0].g2], us=us, mb=round(mb, 1), tbs=mb / us, frac_copy=mb / us / copy_tbs)
