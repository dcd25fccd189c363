"""Sort (token, slot) pairs by expert and pad every expert's run to a multiple of the GEMM's M block.

Three small Triton kernels, no host synchronisation, static shapes (CUDA-graph friendly):
  1. count: per chunk of pairs, a histogram over the local experts (+1 bin for routes owned by
     other EP ranks);
  2. scan (one program): expert totals, padded run starts, the padding sentinels, the expert of
     every M block (-1 past the end) and one write cursor per expert;
  3. scatter: each pair takes a slot in its expert's run with an atomic increment of the cursor.
The order of pairs inside an expert's run is therefore not fixed, but every GEMM row is computed
independently of its neighbours, so results do not depend on it. The padded length is the worst
case ``P + E * (BM - 1)``; blocks past the real end get expert -1 and the GEMMs return at once.

``align_quant_pairs`` (an option of the Gluon prefill path, ``GluonConfig.glue``) does the same in three launches with the 1x128
FP8 quantization of x folded into the scatter: each pair quantizes its token's row straight into its
sorted slot, and the expert of every M block is filled by extra programs of that launch (not by the
one-program scan's serial loop). Padding rows of q / s_t are left unwritten: every GEMM row depends
only on its own A row and padding rows are never stored, so they cannot reach the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .triton_linear import FP8_MAX, GROUP, SCALE_FLOOR

CHUNK = 1024  # pairs per count/scatter program


@dataclass
class AlignedPairs:
    sorted_ids: torch.Tensor    # [Mpad] int32: pair id (token * topk + slot), P = padding
    block_expert: torch.Tensor  # [Mpad // BM] int32: expert of each M block, -1 = empty
    num_pairs: int              # P = T * topk
    block_m: int
    block_span: torch.Tensor | None = None  # [Mpad // BM, 2] int32 (``span=True``): first M block of the
                                            # block's expert run and the run's block count (used blocks only)

    @property
    def padded_rows(self) -> int:
        return self.sorted_ids.shape[0]


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    rows = num_pairs + num_experts * (block_m - 1)
    return (rows + block_m - 1) // block_m * block_m


@triton.jit
def _local_expert(ids_ptr, i, P, offset, E):
    e = tl.load(ids_ptr + i, mask=i < P, other=-1).to(tl.int32) - offset
    return tl.where((i < P) & (e >= 0) & (e < E), e, E)                 # E: not on this rank


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, P, offset, E, CH: tl.constexpr, EB: tl.constexpr):
    c = tl.program_id(0)
    e = _local_expert(ids_ptr, c * CH + tl.arange(0, CH), P, offset, E)
    tl.store(counts_ptr + c * EB + tl.arange(0, EB), tl.histogram(e, EB))


@triton.jit
def _scan_kernel(counts_ptr, cursor_ptr, sorted_ids_ptr, block_expert_ptr, num_chunks, E, P, num_blocks,
                 BM: tl.constexpr, EB: tl.constexpr, NBT: tl.constexpr, pend_ptr=None, BLOCKS: tl.constexpr = True,
                 CB: tl.constexpr = 16, span_ptr=None, SPAN: tl.constexpr = False, rend_ptr=None,
                 REND: tl.constexpr = False):
    ex = tl.arange(0, EB)
    tot = tl.zeros((EB,), tl.int32)
    if BLOCKS:
        for c in range(num_chunks):
            tot += tl.load(counts_ptr + c * EB + ex)
    else:  # CB chunks' histograms per load (not one dependent load per chunk)
        cb = tl.arange(0, CB)
        for c0 in range(0, num_chunks, CB):
            c = c0 + cb
            tot += tl.sum(tl.load(counts_ptr + c[:, None] * EB + ex[None, :], mask=(c < num_chunks)[:, None],
                                  other=0), axis=0)
    tot = tl.where(ex < E, tot, 0)
    padded = (tot + BM - 1) // BM * BM
    pend = tl.cumsum(padded, 0)
    pstart = pend - padded
    tl.store(cursor_ptr + ex, pstart, mask=ex < E)
    j = tl.arange(0, BM)
    slot = (pstart + tot)[:, None] + j[None, :]                          # padding rows of each run
    tl.store(sorted_ids_ptr + slot, P, mask=(slot < pend[:, None]) & (ex < E)[:, None])
    if BLOCKS:
        total = tl.sum(padded, 0)
        pend_e = tl.where(ex < E, pend, 2147483647)
        for b0 in range(0, num_blocks, NBT):
            b = b0 + tl.arange(0, NBT)
            start = b * BM
            before = pend_e[None, :] <= start[:, None]                       # [NBT, EB] runs ending before
            owner = tl.sum(before.to(tl.int32), axis=1)
            tl.store(block_expert_ptr + b, tl.where(start < total, owner, -1), mask=b < num_blocks)
            if SPAN:
                _store_span(span_ptr, b, start, before, pend_e[None, :], b < num_blocks, BM, 1)
    else:  # align_quant_pairs: the scatter launch fills block_expert from the run ends
        tl.store(pend_ptr + ex, pend, mask=ex < E)
        if REND:                                                         # and zeroes the padding rows
            tl.store(rend_ptr + ex, pstart + tot, mask=ex < E)


@triton.jit
def _store_span(span_ptr, b, start, before, pend, ok, BM: tl.constexpr, AXIS: tl.constexpr):
    """span[b] = (first M block of block b's expert run, the run's blocks), from ``before`` [.., EB] (which
    runs end at or before the block's first row ``start``) and the run ends ``pend`` [1 or .., EB]
    (non-decreasing; INT32_MAX past the local experts). Runs of empty experts have zero length."""
    first = tl.max(tl.where(before, pend, 0), axis=AXIS)                # end of the previous run
    end = tl.min(tl.where(before, 2147483647, pend), axis=AXIS)          # end of this block's run
    end = tl.where(end == 2147483647, first, end)                        # past the last run: empty
    tl.store(span_ptr + 2 * b, first // BM, mask=ok)
    tl.store(span_ptr + 2 * b + 1, (end - first) // BM, mask=ok)


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ids_ptr, P, offset, E, CH: tl.constexpr):
    i = tl.program_id(0) * CH + tl.arange(0, CH)
    e = _local_expert(ids_ptr, i, P, offset, E)
    ok = e < E
    pos = tl.atomic_add(cursor_ptr + tl.where(ok, e, 0), 1, mask=ok)
    tl.store(sorted_ids_ptr + pos, i, mask=ok)


@triton.jit
def _scatter_quant_kernel(ids_ptr, cursor_ptr, pend_ptr, sorted_ids_ptr, block_expert_ptr, x_ptr, q_ptr, s_ptr,
                          P, offset, E, K, stride_xm, stride_qm, stride_st, row_progs,
                          TOPK: tl.constexpr, BM: tl.constexpr, EB: tl.constexpr, NG: tl.constexpr, G: tl.constexpr,
                          R: tl.constexpr = 1, span_ptr=None, SPAN: tl.constexpr = False, rend_ptr=None,
                          ZPAD: tl.constexpr = False):
    """Programs [0, row_progs): pairs [R * pid, R * pid + R) each take a slot in their expert's run and write
    their token's row of x there, quantized 1x128 (q [Mpad, Kp] fp8, s_t [ceil(K/G), Mpad]; as
    ``triton_linear._quant_rows_kernel``). The x rows are loaded and quantized before the slots are taken
    (relaxed atomics; the row's load does not wait for the pair's expert id). Programs [row_progs, row_progs +
    num_blocks): the expert of M block b (-1 past the last run); ZPAD: also the block's padding rows of q as
    zeros (scales 0), rend = the runs' real ends."""
    pid = tl.program_id(0)
    if pid < row_progs:
        i = pid * R + tl.arange(0, R)                                       # [R] pairs
        e = _local_expert(ids_ptr, i, P, offset, E)
        ok = e < E
        cols = tl.arange(0, NG * G)
        x = tl.load(x_ptr + (i // TOPK).to(tl.int64)[:, None] * stride_xm + cols[None, :],
                    mask=(i < P)[:, None] & (cols < K)[None, :], other=0.0)      # not waiting for the ids
        xg = tl.reshape(x.to(tl.float32), (R, NG, G))
        scale = tl.maximum(tl.max(tl.abs(xg), axis=2), SCALE_FLOOR) / FP8_MAX           # [R, NG]
        q = tl.reshape(xg / scale[:, :, None], (R, NG * G)).to(tl.float8e4nv)
        pos = tl.atomic_add(cursor_ptr + tl.where(ok, e, 0), 1, mask=ok, sem="relaxed")
        tl.store(sorted_ids_ptr + pos, i, mask=ok)
        tl.store(q_ptr + pos.to(tl.int64)[:, None] * stride_qm + cols[None, :], q,
                 mask=ok[:, None] & (cols < tl.cdiv(K, G) * G)[None, :])
        g = tl.arange(0, NG)
        tl.store(s_ptr + g[None, :] * stride_st + pos[:, None], scale, mask=ok[:, None] & (g < tl.cdiv(K, G))[None, :])
    else:
        b = pid - row_progs
        ex = tl.arange(0, EB)
        pend = tl.load(pend_ptr + ex, mask=ex < E, other=0)                 # run ends (non-decreasing)
        before = (pend <= b * BM) & (ex < E)
        owner = tl.sum(before.to(tl.int32), axis=0)                         # runs ending at or before the block
        tl.store(block_expert_ptr + b, tl.where(b * BM < tl.max(pend, axis=0), owner, -1))
        if SPAN:
            _store_span(span_ptr, b, b * BM, before, tl.where(ex < E, pend, 2147483647), True, BM, 0)
        if ZPAD:
            if b * BM < tl.max(pend, axis=0):
                lo = tl.maximum(tl.load(rend_ptr + owner), b * BM)               # padding rows of this block
                hi = tl.minimum(tl.load(pend_ptr + owner), b * BM + BM)
                cols = tl.arange(0, NG * G)
                g = tl.arange(0, NG)
                for r0 in range(lo, hi, 4):
                    r = r0 + tl.arange(0, 4)
                    tl.store(q_ptr + r.to(tl.int64)[:, None] * stride_qm + cols[None, :],
                             tl.zeros((4, NG * G), tl.float8e4nv),
                             mask=(r < hi)[:, None] & (cols < tl.cdiv(K, G) * G)[None, :])
                    tl.store(s_ptr + g[None, :] * stride_st + r[:, None], tl.zeros((4, NG), tl.float32),
                             mask=(r < hi)[:, None] & (g < tl.cdiv(K, G))[None, :])


def align_quant_pairs(x: torch.Tensor, ids: torch.Tensor, num_experts: int, block_m: int,
                      offset: int = 0, span: bool = False, rows_per_prog: int = 1,
                      zero_pad: bool = False) -> tuple[AlignedPairs, torch.Tensor, torch.Tensor]:
    """``align_pairs`` and ``triton_linear.quantize_gathered_rows`` in three launches: x [T, K] bf16,
    ids [T, topk] -> (AlignedPairs, q [Mpad, Kp] fp8, s_t [ceil(K/128), Mpad] fp32); q / s_t rows of
    padding slots and empty blocks are left unwritten (see the module docstring). ``span``: also
    ``block_span`` (as ``align_pairs``). ``rows_per_prog`` (a power of 2): pairs quantized per program of the
    scatter launch (bitwise the same rows and scales whatever it is). ``zero_pad``: padding rows of used blocks
    written as zeros (scales 0) instead of left unwritten."""
    if rows_per_prog < 1 or rows_per_prog & (rows_per_prog - 1):
        raise ValueError(f"rows_per_prog must be a power of 2, got {rows_per_prog}")
    if ids.dim() != 2 or x.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"expected x [T, K] and ids [T, topk], got {tuple(x.shape)} and {tuple(ids.shape)}")
    ids = ids.contiguous()
    if x.stride(1) != 1:
        x = x.contiguous()
    dev, E, P = ids.device, num_experts, ids.numel()
    K = x.shape[1]
    mpad = max_padded_rows(P, E, block_m)
    nb = mpad // block_m
    ch = min(CHUNK, max(16, triton.next_power_of_2(P)))
    nchunks = triton.cdiv(P, ch)
    eb = triton.next_power_of_2(E + 1)
    ng = triton.cdiv(K, GROUP)
    counts = torch.empty((nchunks, eb), dtype=torch.int32, device=dev)
    cursor = torch.empty((eb,), dtype=torch.int32, device=dev)
    pend = torch.empty((eb,), dtype=torch.int32, device=dev)
    rend = torch.empty((eb,), dtype=torch.int32, device=dev) if zero_pad else pend
    sorted_ids = torch.empty((mpad,), dtype=torch.int32, device=dev)
    block_expert = torch.empty((nb,), dtype=torch.int32, device=dev)
    block_span = torch.zeros((nb, 2), dtype=torch.int32, device=dev) if span else None
    q = torch.empty((mpad, ng * GROUP), dtype=torch.float8_e4m3fn, device=dev)
    s_t = torch.empty((ng, mpad), dtype=torch.float32, device=dev)
    if P:
        ng_p2 = triton.next_power_of_2(ng)
        _count_kernel[(nchunks,)](ids, counts, P, offset, E, CH=ch, EB=eb, num_warps=4)
        _scan_kernel[(1,)](counts, cursor, sorted_ids, block_expert, nchunks, E, P, nb,
                           BM=block_m, EB=eb, NBT=16, pend_ptr=pend, BLOCKS=False, CB=max(1, 4096 // eb),
                           rend_ptr=rend, REND=zero_pad, num_warps=4)
        progs = triton.cdiv(P, rows_per_prog)
        _scatter_quant_kernel[(progs + nb,)](ids, cursor, pend, sorted_ids, block_expert, x, q, s_t, P, offset, E, K,
                                             x.stride(0), q.stride(0), s_t.stride(0), progs, TOPK=ids.shape[1],
                                             BM=block_m, EB=eb, NG=ng_p2, G=GROUP, R=rows_per_prog,
                                             span_ptr=block_span, SPAN=span, rend_ptr=rend, ZPAD=zero_pad,
                                             num_warps=4 if ng_p2 * rows_per_prog <= 16 else 8)
    else:
        block_expert.fill_(-1)
    al = AlignedPairs(sorted_ids=sorted_ids, block_expert=block_expert, num_pairs=P, block_m=block_m,
                      block_span=block_span)
    return al, q, s_t


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int, offset: int = 0,
                span: bool = False) -> AlignedPairs:
    """ids [T, topk] int (global expert of each pair) -> AlignedPairs over the local experts
    ``[offset, offset + num_experts)``; pairs routed elsewhere (other EP ranks) are left out. ``span``:
    also ``block_span`` (each used block's expert run as (first block, blocks): the Gluon GEMMs' walk by
    expert, ``GluonConfig.walk``)."""
    if ids.dim() != 2:
        raise ValueError(f"expert ids must be [T, topk], got shape {tuple(ids.shape)}")
    ids = ids.contiguous()
    dev, E, P = ids.device, num_experts, ids.numel()
    mpad = max_padded_rows(P, E, block_m)
    nb = mpad // block_m
    ch = min(CHUNK, max(16, triton.next_power_of_2(P)))
    nchunks = triton.cdiv(P, ch)
    eb = triton.next_power_of_2(E + 1)
    counts = torch.empty((nchunks, eb), dtype=torch.int32, device=dev)
    cursor = torch.empty((eb,), dtype=torch.int32, device=dev)
    sorted_ids = torch.empty((mpad,), dtype=torch.int32, device=dev)
    block_expert = torch.empty((nb,), dtype=torch.int32, device=dev)
    block_span = torch.zeros((nb, 2), dtype=torch.int32, device=dev) if span else None
    if P:
        _count_kernel[(nchunks,)](ids, counts, P, offset, E, CH=ch, EB=eb, num_warps=4)
        _scan_kernel[(1,)](counts, cursor, sorted_ids, block_expert, nchunks, E, P, nb,
                           BM=block_m, EB=eb, NBT=max(16, min(256, 4096 // eb)), span_ptr=block_span, SPAN=span,
                           num_warps=4)
        _scatter_kernel[(nchunks,)](ids, cursor, sorted_ids, P, offset, E, CH=ch, num_warps=4)
    else:
        block_expert.fill_(-1)
    return AlignedPairs(sorted_ids=sorted_ids, block_expert=block_expert, num_pairs=P, block_m=block_m,
                        block_span=block_span)
