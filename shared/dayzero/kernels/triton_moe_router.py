"""Router top-k in one Triton kernel: top-k logits per token, then softmax over those k only.

Matches HF ``GptOssTopKRouter``: ``torch.topk`` (descending; among equal logits the lower expert
id first) then ``softmax(top_values, dtype=logits.dtype)``: the softmax is computed in fp32 and
rounded to the logits' dtype (bf16 in the model: the seed found bf16 weights matter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _router_topk_kernel(
    logits_ptr, w_ptr, ids_ptr, T, E, stride_t,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_E: tl.constexpr, ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < T
    x = tl.load(logits_ptr + rows.to(tl.int64)[:, None] * stride_t + cols[None, :],
                mask=row_ok[:, None] & (cols < E)[None, :], other=float("-inf")).to(tl.float32)
    kcols = tl.arange(0, KP)
    vals = tl.full((ROWS, KP), float("-inf"), tl.float32)
    idx = tl.zeros((ROWS, KP), tl.int32)
    for i in tl.static_range(K):
        m = tl.max(x, axis=1)                                                    # [ROWS]
        first = tl.min(tl.where(x == m[:, None], cols[None, :], BLOCK_E), axis=1)  # lowest id on ties
        vals = tl.where(kcols[None, :] == i, m[:, None], vals)
        idx = tl.where(kcols[None, :] == i, first[:, None], idx)
        x = tl.where(cols[None, :] == first[:, None], float("-inf"), x)
    top = tl.max(vals, axis=1)
    p = tl.exp(vals - top[:, None])                                              # padding slots: exp(-inf) = 0
    p = p / tl.sum(p, axis=1)[:, None]
    out_mask = row_ok[:, None] & (kcols < K)[None, :]
    offs = rows.to(tl.int64)[:, None] * K + kcols[None, :]
    tl.store(w_ptr + offs, p.to(w_ptr.dtype.element_ty), mask=out_mask)
    tl.store(ids_ptr + offs, idx.to(tl.int64), mask=out_mask)


def router_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [T, E], k) -> (weights [T, k] in logits' dtype, ids [T, k] int64)."""
    if logits.dim() != 2:
        raise ValueError(f"router logits must be [T, E], got shape {tuple(logits.shape)}")
    T, E = logits.shape
    if not 0 < k <= E:
        raise ValueError(f"top-k must be in 1..{E}, got {k}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    weights = torch.empty((T, k), dtype=logits.dtype, device=logits.device)
    ids = torch.empty((T, k), dtype=torch.int64, device=logits.device)
    if T == 0:
        return weights, ids
    rows = 16
    _router_topk_kernel[(triton.cdiv(T, rows),)](
        logits, weights, ids, T, E, logits.stride(0),
        K=k, KP=triton.next_power_of_2(k), BLOCK_E=triton.next_power_of_2(E), ROWS=rows, num_warps=4,
    )
    return weights, ids
