"""Routing helpers of the split-K decode MoE (``triton_moe_small_split_kernels`` uses them): which
local expert a program's slot stands for and which (token, route) pairs are its rows.

Two ways to a slot's expert and rows:
  * ``PLAN``: ``plan_kernel`` (one program per slot) writes the s-th smallest touched local expert,
    its token count and pair ids (token order) to small tables; the GEMM programs read them.
  * else (T * k small): slot = pair p; the slot is valid when p is the first pair routed to its
    (local) expert, and its rows are the pairs routed there, found from the <= PB ids in-kernel.
Pairs are token-major (pair = token * k + route), so pair order is token order. A token routes to an
expert at most once (top-k ids are distinct).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _slot_expert(ids_ptr, s, T, offset, E, TOPK: tl.constexpr, PB: tl.constexpr, EB: tl.constexpr):
    """Local expert of slot s (the s-th smallest touched local id), -1 when fewer are touched."""
    i = tl.arange(0, PB)
    ok = i < T * TOPK
    e = tl.load(ids_ptr + i, mask=ok, other=-1).to(tl.int32) - offset
    e = tl.where(ok & (e >= 0) & (e < E), e, E)                      # bin E: not on this rank
    ex = tl.arange(0, EB)
    present = (tl.histogram(e, EB) > 0) & (ex < E)
    rank = tl.cumsum(present.to(tl.int32), 0) - 1
    return tl.max(tl.where(present & (rank == s), ex, -1), 0)


@triton.jit
def _expert_tokens(ids_ptr, e, T, offset, TOPK: tl.constexpr, TB: tl.constexpr, KP: tl.constexpr):
    """Per token t [TB]: routes to local expert e (0/1), its slot j there, rank among those tokens."""
    t = tl.arange(0, TB)
    j = tl.arange(0, KP)
    ok = (t < T)[:, None] & (j < TOPK)[None, :]
    ids = tl.load(ids_ptr + t[:, None] * TOPK + j[None, :], mask=ok, other=-1).to(tl.int32) - offset
    match = ok & (ids == e)
    tin = tl.sum(match.to(tl.int32), 1)
    jsel = tl.sum(tl.where(match, j[None, :], 0), 1)
    return tin, jsel, tl.cumsum(tin, 0) - 1, tl.sum(tin, 0)


@triton.jit
def plan_kernel(ids_ptr, slot_e_ptr, slot_cnt_ptr, slot_pairs_ptr, T, offset, E,
                TOPK: tl.constexpr, TB: tl.constexpr, KP: tl.constexpr, EB: tl.constexpr):
    """Program s: slot s's local expert (-1: unused), its token count and pair ids (token order)."""
    s = tl.program_id(0)
    e = _slot_expert(ids_ptr, s, T, offset, E, TOPK, TB * KP, EB)
    tin, jsel, rank, cnt = _expert_tokens(ids_ptr, e, T, offset, TOPK, TB, KP)
    t = tl.arange(0, TB)
    tl.store(slot_pairs_ptr + s * TB + rank, t * TOPK + jsel, mask=(tin > 0) & (e >= 0))
    tl.store(slot_e_ptr + s, e)
    tl.store(slot_cnt_ptr + s, tl.where(e >= 0, cnt, 0))


@triton.jit
def _local_ids(ids_ptr, P, offset, PB: tl.constexpr):
    """(pair index q [PB], local expert id of pair q (out of range for padding))."""
    q = tl.arange(0, PB)
    return q, tl.load(ids_ptr + q, mask=q < P, other=-1).to(tl.int32) - offset


@triton.jit
def _slot(ids_ptr, slot_e_ptr, slot_cnt_ptr, s, P, offset, E, PB: tl.constexpr, PLAN: tl.constexpr):
    """(local expert of slot s or -1, its token count): from the plan tables, or slot = pair s,
    valid when s is the first pair routed to that (local) expert."""
    if PLAN:
        return tl.load(slot_e_ptr + s), tl.load(slot_cnt_ptr + s)
    else:
        q, idq = _local_ids(ids_ptr, P, offset, PB)
        e = tl.load(ids_ptr + s).to(tl.int32) - offset
        match = (q < P) & (idq == e)
        first = tl.min(tl.where(match, q, PB), 0)
        return tl.where((first == s) & (e >= 0) & (e < E), e, -1), tl.sum(match.to(tl.int32), 0)


@triton.jit
def _rows(ids_ptr, slot_pairs_ptr, s, e, cnt, c, P, offset, TB: tl.constexpr, BM: tl.constexpr,
          PB: tl.constexpr, PLAN: tl.constexpr):
    """Rows c .. c+BM of slot s (expert e) -> (pair id [BM], row valid [BM]), token order."""
    m = c + tl.arange(0, BM)
    row_ok = m < cnt
    if PLAN:
        pair = tl.load(slot_pairs_ptr + s * TB + m, mask=row_ok, other=0)
    else:
        q, idq = _local_ids(ids_ptr, P, offset, PB)
        match = (q < P) & (idq == e)
        rank = tl.cumsum(match.to(tl.int32), 0) - 1
        sel = match[None, :] & (rank[None, :] == m[:, None])            # [BM, PB]
        pair = tl.sum(tl.where(sel, q[None, :], 0), 1)
    return pair, row_ok


@triton.jit
def _chunk_end(cnt, ONE_CHUNK: tl.constexpr):
    """End of the chunk loop: 1 when no expert can have more than BM tokens (T <= BM): a loop of
    one trip that the compiler removes (a dynamic outer loop around the pipelined K loop costs
    ~60 registers, sm_90 compile)."""
    if ONE_CHUNK:
        return 1
    else:
        return cnt


@triton.jit
def _touched(ids_ptr, slot_e_ptr, n_slots, P, offset, E, PB: tl.constexpr, PLAN: tl.constexpr):
    """Number of distinct local experts the call routes to (= valid slots)."""
    if PLAN:
        i = tl.arange(0, PB)
        return tl.sum((tl.load(slot_e_ptr + i, mask=i < n_slots, other=-1) >= 0).to(tl.int32), 0)
    else:
        q, idq = _local_ids(ids_ptr, P, offset, PB)
        idr = tl.load(ids_ptr + q, mask=q < P, other=-1).to(tl.int32) - offset   # same ids, row side
        earlier = (q[None, :] < q[:, None]) & (idq[None, :] == idr[:, None])      # [PB, PB]
        lead = (q < P) & (idr >= 0) & (idr < E) & (tl.sum(earlier.to(tl.int32), 1) == 0)
        return tl.sum(lead.to(tl.int32), 0)


# ---- leader slots from ids loaded once (``IDS1``): the helpers above reload the ids each, and in the sm_90
# build of the fused down kernel those loads sit behind the branches on the previous ones' results, so a
# program waited three dependent L2 round trips before its first weight load; from one [PB] load it waits one


@triton.jit
def _touched_of(q, idq, P, E):
    """``_touched`` (leader slots) on the pair ids ``idq`` [PB] already loaded (``_local_ids``)."""
    earlier = (q[None, :] < q[:, None]) & (idq[None, :] == idq[:, None])       # [PB, PB]
    lead = (q < P) & (idq >= 0) & (idq < E) & (tl.sum(earlier.to(tl.int32), 1) == 0)
    return tl.sum(lead.to(tl.int32), 0)


@triton.jit
def _slot_of(q, idq, s, P, E, PB: tl.constexpr):
    """``_slot`` (leader slots: slot = pair s < P) on the loaded pair ids."""
    e = tl.sum(tl.where(q == s, idq, 0), 0)
    match = (q < P) & (idq == e)
    first = tl.min(tl.where(match, q, PB), 0)
    return tl.where((first == s) & (e >= 0) & (e < E), e, -1), tl.sum(match.to(tl.int32), 0)


@triton.jit
def _rows_of(q, idq, e, cnt, c, P, BM: tl.constexpr):
    """``_rows`` (leader slots) on the loaded pair ids: rows c .. c+BM of expert e -> (pair id, valid)."""
    m = c + tl.arange(0, BM)
    match = (q < P) & (idq == e)
    rank = tl.cumsum(match.to(tl.int32), 0) - 1
    sel = match[None, :] & (rank[None, :] == m[:, None])                        # [BM, PB]
    return tl.sum(tl.where(sel, q[None, :], 0), 1), m < cnt
