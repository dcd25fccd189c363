"""Small-M dense FP8 linear (decode): bf16 activations x FP8 weights, split-K in ONE launch.

At M <= 16 rows the op is a weight stream: q [4096 x 2880] is 11.8 MB, 2.8 us at 4.26 TB/s. The
N tiles alone give too few programs to keep enough bytes in flight (q: 64 tiles of 64 rows), so
the K blocks are split over ``SPLIT`` programs per N tile. Instead of a second reduce launch, each
program stores its fp32 partial tile into its own slice of a per-weight workspace [SPLIT, 16, N]
and takes a ticket; the program holding the last ticket of its N tile sums the partials in split
order (the same bits whatever order the programs ran in: graph and eager runs agree), adds the
bias, writes the bf16 output and resets the ticket. Tickets are zero between calls and every
partial is rewritten by each call: no memset, no host sync, CUDA-graph safe. One workspace per
weight (kept in ``LinearWeight.derived``): calls on the same weight must not run concurrently on
two streams (the engine runs one forward at a time).

Weight layout: [N, K] float8_e4m3fn, one fp32 scale per 128x128 block (partial edge blocks masked).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from .triton_moe_gemm import interpreting
from .types import BLOCK, LinearWeight

MAX_M = 16          # rows one call serves (the dot's M side is padded to 16)
MODES = ("bf16", "dot16", "swap")
BLOCK_C = tl.constexpr(BLOCK)


@triton.jit
def _fence_gpu(like):
    """fence.acq_rel.gpu in every thread (its earlier atomics are done before what follows)."""
    return tl.inline_asm_elementwise("fence.acq_rel.gpu;\n mov.u32 $0, 0;", "=r,r", [like], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def pow2_row_scales(x):
    """x [16, BK] bf16 -> (r, 1 / r) [16] fp32, powers of two with max |x * r| in [2^14, 2^15) per row: bf16
    values then sit in fp16's normal range with their 8 significant bits intact (down to 2^-28 of the row's
    max). Built from the exponent bits, so both are exact."""
    amax = tl.max(tl.abs(x.to(tl.float32)), axis=1)
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF                      # biased exponent of the row max
    e = tl.minimum(tl.maximum(e, 15), 254)                                   # zero / tiny rows: r = 2^126
    return ((268 - e) << 23).to(tl.float32, bitcast=True), ((e - 14) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_k_loop(x_ptrs, w_ptrs, s_row, xs_ptr, offs_m, offs_k, m_ok, n_ok, kb0, kb1, K, stride_xsm, stride_xsk,
                 BN: tl.constexpr, BK: tl.constexpr, X_SCALED: tl.constexpr, DOT_F32: tl.constexpr,
                 DOT16: tl.constexpr):
    """The K loop of one program with x as the MMA's A operand: [16, BN] fp32 partial sums."""
    acc = tl.zeros((16, BN), tl.float32)
    for kb in range(kb0, kb1):
        k_ok = kb * BK + offs_k < K
        x = tl.load(x_ptrs + kb * BK, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs + kb * BK, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        s = tl.load(s_row + kb)
        if DOT_F32:
            part = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)))
        elif not DOT16:
            part = tl.dot(x.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))   # fp8 x widens exactly
        elif X_SCALED:  # e4m3 x and w widen exactly to fp16 (one cvt per two values; to bf16 two more)
            part = tl.dot(x.to(tl.float16), tl.trans(w.to(tl.float16)))
        else:  # bf16 x: each row scaled by a power of two into fp16's range first (exact), undone after
            r, inv = pow2_row_scales(x)                                                  # [16] fp32 each
            xh = (x.to(tl.float32) * r[:, None]).to(tl.float16)
            part = tl.dot(xh, tl.trans(w.to(tl.float16))) * inv[:, None]
        if X_SCALED:  # fp8 activations: one scale per row per 128 columns
            xs = tl.load(xs_ptr + offs_m * stride_xsm + kb * stride_xsk, mask=m_ok, other=0.0)
            part = part * xs[:, None]
        acc += part * s
    return acc


@triton.jit
def _gemv_k_loop_swap(x_ptrs, w_ptrs, s_row, xs_ptr, offs_m, offs_k, m_ok, n_ok, kb0, kb1, K, stride_xsm, stride_xsk,
                      BN: tl.constexpr, BK: tl.constexpr, DOT_F32: tl.constexpr):
    """The K loop with fp8 x ("swap AB"): the weight tile [BN, BK] is the MMA's A operand (M = BN rows), x^T its
    B operand (N = 16): e4m3 x e4m3 products straight from the loaded bytes, nothing widened. [BN, 16] fp32."""
    acc = tl.zeros((BN, 16), tl.float32)
    for kb in range(kb0, kb1):
        k_ok = kb * BK + offs_k < K
        x = tl.load(x_ptrs + kb * BK, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs + kb * BK, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        s = tl.load(s_row + kb)
        xs = tl.load(xs_ptr + offs_m * stride_xsm + kb * stride_xsk, mask=m_ok, other=0.0)
        if DOT_F32:
            part = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)))
        else:
            part = tl.dot(w, tl.trans(x))
        acc += part * (xs * s)[None, :]
    return acc


@triton.jit
def _gemv_splitk_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, ws_ptr, ticket_ptr,
                        M, N, K, stride_xm, stride_xsm, stride_xsk, stride_wn, stride_sn, stride_om,
                        BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                        X_SCALED: tl.constexpr, DOT_F32: tl.constexpr, DOT16: tl.constexpr = False,
                        FENCE: tl.constexpr = True, SWAP: tl.constexpr = False):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, 16)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    m_ok = offs_m < M
    n_ok = offs_n < N
    nkb = tl.cdiv(K, BK)
    per = tl.cdiv(nkb, SPLIT)
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, nkb)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]                      # [16, BK]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]           # [BN, BK]
    s_row = s_ptr + ((pid_n * BN) // BLOCK_C) * stride_sn                                 # BN divides 128
    if SWAP:
        acc = tl.trans(_gemv_k_loop_swap(x_ptrs, w_ptrs, s_row, xs_ptr, offs_m, offs_k, m_ok, n_ok, kb0, kb1, K,
                                         stride_xsm, stride_xsk, BN, BK, DOT_F32))               # [16, BN]
    else:
        acc = _gemv_k_loop(x_ptrs, w_ptrs, s_row, xs_ptr, offs_m, offs_k, m_ok, n_ok, kb0, kb1, K, stride_xsm,
                           stride_xsk, BN, BK, X_SCALED, DOT_F32, DOT16)
    out_mask = m_ok[:, None] & n_ok[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    if SPLIT == 1:
        total = acc
    else:
        ws_ptrs = ws_ptr + offs_m[:, None] * N + offs_n[None, :]                          # [SPLIT, 16, N] fp32
        tl.store(ws_ptrs + pid_k * 16 * N, acc, mask=out_mask)
        if FENCE:  # (the CPU interpreter runs programs one by one and has no inline asm)
            _fence_gpu(offs_m)       # every thread's stores are visible GPU-wide before the ticket is taken
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + pid_n, 1, sem="acq_rel")
        if ticket != SPLIT - 1:
            return
        total = tl.zeros((16, BN), tl.float32)
        for j in tl.static_range(SPLIT):   # split order: deterministic
            total += tl.load(ws_ptrs + j * 16 * N, mask=out_mask, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(ticket_ptr + pid_n, 0, sem="relaxed")
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)


@dataclass
class GemvConfig:
    bn: int = 64
    split: int | None = None    # None: enough K splits for ``target_programs``
    warps: int = 4
    stages: int = 4
    target_programs: int = 264  # 2 per SM on an H200
    # the products (DAYZERO_GEMV_MODE; bench/NOTES.md "Small-M dense linear"): "swap" (default since session 8:
    # fp8 x: the weight tile as the A operand of an e4m3 x e4m3 wgmma, nothing widened; bf16 x: as dot16; H200, M = 1:
    # qkv 15.8 -> 8.8 us, o 9.9 -> 9.0, lm_head 193 -> 164), "dot16" (fp16 products: one F2FP per two weights; fp8 x
    # widens exactly, bf16 x through power-of-two row scales), "bf16" (the earlier kernel: e4m3 -> bf16 widening, two
    # quarter-rate F2F a weight, which bound it)
    mode: str = field(default_factory=lambda: os.environ.get("DAYZERO_GEMV_MODE", "swap"))

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"gemv: mode must be one of {MODES}, got {self.mode!r}")


@dataclass
class _Workspace:
    partials: torch.Tensor  # [SPLIT, 16, N] fp32, one slice per K split, rewritten by every call
    tickets: torch.Tensor   # [ceil(N/bn)] int32, zero between calls


def choose_split(N: int, K: int, cfg: GemvConfig) -> int:
    if cfg.split is not None:
        return max(1, min(cfg.split, triton.cdiv(K, BLOCK)))
    tiles = triton.cdiv(N, cfg.bn)
    nkb = triton.cdiv(K, BLOCK)
    split = min(max(1, triton.cdiv(cfg.target_programs, tiles)), max(1, nkb // 2))  # >= 2 K blocks each
    return triton.cdiv(nkb, triton.cdiv(nkb, split))  # no empty splits


def _workspace(weight: LinearWeight, bn: int, split: int) -> _Workspace:
    key = f"gemv_ws_{bn}_{split}"
    ws = weight.derived.get(key)
    if ws is None:
        N = weight.weight.shape[0]
        dev = weight.weight.device
        ws = _Workspace(torch.empty((split, MAX_M, N), dtype=torch.float32, device=dev),
                        torch.zeros((triton.cdiv(N, bn),), dtype=torch.int32, device=dev))
        weight.derived[key] = ws
    return ws


def gemv_fp8(x: torch.Tensor, weight: LinearWeight, cfg: GemvConfig | None = None,
             x_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M <= 16, K] bf16 -> [M, N] bf16 = x @ dequant(weight).T + bias; or x float8 [M, >= K] with
    ``x_scale`` [M, ceil(K/128)] fp32 (1x128 groups, any strides): dequant(x) @ dequant(weight).T + bias."""
    cfg = cfg or GemvConfig()
    w, s = weight.weight, weight.scale
    N, K = w.shape
    M = x.shape[0]
    if M > MAX_M or x.shape[1] < K or (x.shape[1] != K and x.dtype != torch.float8_e4m3fn):
        raise ValueError(f"gemv_fp8: x must be [<= {MAX_M}, {K}], got {tuple(x.shape)}")
    if BLOCK % cfg.bn:
        raise ValueError(f"gemv_fp8: bn must divide {BLOCK}, got {cfg.bn}")
    x_fp8 = x.dtype == torch.float8_e4m3fn
    if x_fp8 and (x_scale is None or x_scale.shape[0] < M or x_scale.shape[1] != triton.cdiv(K, BLOCK)):
        raise ValueError(f"gemv_fp8: float8 x needs x_scale [{M}, {triton.cdiv(K, BLOCK)}], got "
                         f"{None if x_scale is None else tuple(x_scale.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    split = choose_split(N, K, cfg)
    ws = _workspace(weight, cfg.bn, split) if split > 1 else None
    bias = weight.bias
    swap = cfg.mode == "swap" and x_fp8
    dot16 = cfg.mode != "bf16" and not swap   # (the interpreter runs this one's fp16 dot too; the others in fp32)
    _gemv_splitk_kernel[(triton.cdiv(N, cfg.bn), split)](
        x, x_scale if x_fp8 else s, w, s, bias if bias is not None else s, out,
        ws.partials if ws else out, ws.tickets if ws else out,
        M, N, K, x.stride(0), x_scale.stride(0) if x_fp8 else 0, x_scale.stride(1) if x_fp8 else 0,
        w.stride(0), s.stride(0), out.stride(0),
        BN=cfg.bn, BK=BLOCK, SPLIT=split, HAS_BIAS=bias is not None, X_SCALED=x_fp8,
        DOT_F32=interpreting() and not dot16, DOT16=dot16, FENCE=not interpreting(), SWAP=swap,
        num_warps=cfg.warps, num_stages=cfg.stages,
    )
    return out
