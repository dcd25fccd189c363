"""Triton GEMM kernel shared by the dense FP8 linear and the fused MoE (grouped over experts).

One kernel, specialised by constexpr flags:
  * ``A_FP8``: A is float8_e4m3fn with 1x128 per-row group scales (large-M path: FP8 x FP8 on the
    tensor cores, each 128-wide K step scaled and promoted to fp32, DeepSeek style); otherwise A is
    bf16 and each FP8 weight tile is widened to bf16 in registers (small-M path: weight-only,
    bandwidth bound, no activation quantization at all).
  * ``ROUTED``: rows are positions in the expert-sorted, block-padded pair list built by
    ``triton_moe_align``; every M block belongs to one expert (``block_expert``, -1 = empty block).
    ``GATHER_A``: A row = token of the pair (gate_up reads x directly, no gathered copy).
    ``SCATTER_C``: C row = pair id (down writes each pair's output in token order for the combine).
  * ``EPI``: 0 = ``acc + bias``; 1 = gate_up epilogue: ``+ bias``, clamped SwiGLU on the
    interleaved gate (even) / up (odd) columns, result h (BN/2 columns); with ``QUANT_OUT`` h is
    quantized to FP8 with one scale per row per 128 columns (needs BN == 256 so one tile is one
    group); 2 = down epilogue: ``(acc + bias) * routing weight``.

Scales: weight scales ``bs`` [E, ceil(N/128), ceil(K/128)] (128x128 blocks, partial edge blocks
allowed: K and N tails are masked, nothing needs padding here). Activation scales are stored
group-major: scale of row r, group g at ``as_ptr + g * stride_as + r`` (coalesced per K step).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from .triton_swiglu import clamped_swiglu

FP8_MAX = tl.constexpr(448.0)
SCALE_FLOOR = tl.constexpr(1e-10)  # amax floor before dividing (an all-zero group gets a tiny, finite scale)


def tma_ok(*tensors) -> bool:
    """Whether every tensor can back a TMA descriptor (16-byte aligned base and leading strides)."""
    return all(t.data_ptr() % 16 == 0 and t.stride(-1) == 1
               and all(st * t.element_size() % 16 == 0 for st in t.stride()[:-1]) for t in tensors)


def interpreting() -> bool:
    """Triton's CPU interpreter (TRITON_INTERPRET=1) mis-multiplies bf16/fp8 dots: use fp32 there."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def moe_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, bias_ptr, c_ptr, cs_ptr,
    sorted_ids_ptr, block_expert_ptr, weights_ptr,
    M, N, K, num_pairs,
    stride_am, stride_as,
    stride_be, stride_bn,
    stride_bse, stride_bsn,
    stride_biase,
    stride_cm, stride_cs,
    limit, alpha,
    TOPK: tl.constexpr, ROUTED: tl.constexpr, GATHER_A: tl.constexpr, SCATTER_C: tl.constexpr,
    A_FP8: tl.constexpr, EPI: tl.constexpr, QUANT_OUT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    A_TMA: tl.constexpr = False, B_TMA: tl.constexpr = False, DOT_F32: tl.constexpr = False,
    SPLIT_K: tl.constexpr = 1,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    # grouped ordering: GROUP_M row blocks share the B tiles they walk through (L2 reuse)
    width = GROUP_M * num_pid_n
    group = pid // width
    first_m = group * GROUP_M
    gsize = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gsize
    pid_n = (pid % width) // gsize

    offs_m = pid_m * BM + tl.arange(0, BM)
    if ROUTED:
        e = tl.load(block_expert_ptr + pid_m)
        if e < 0:
            return
        pair = tl.load(sorted_ids_ptr + offs_m)                # [BM] int32; num_pairs = padding
        row_ok = pair < num_pairs
        pair = tl.where(row_ok, pair, 0)
        if GATHER_A:
            a_row = pair // TOPK
        else:
            a_row = offs_m
        if SCATTER_C:
            c_row = pair
        else:
            c_row = offs_m
        e64 = e.to(tl.int64)
    else:
        row_ok = offs_m < M
        a_row = tl.where(row_ok, offs_m, 0)
        c_row = offs_m
        pair = offs_m
        e64 = 0
    a_row = a_row.to(tl.int64)

    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    offs_nc = tl.where(n_ok, offs_n, 0)
    offs_k = tl.arange(0, BK)
    if not A_TMA:
        a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :]
    if not B_TMA:
        b_ptrs = b_ptr + e64 * stride_be + offs_nc[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    bs_base = bs_ptr + e64 * stride_bse + ((pid_n * BN) // 128) * stride_bsn  # BN | 128 or 128 | BN

    # split-K (dense small-M only): program_id(1) takes a contiguous share of the K blocks and
    # writes an fp32 partial to c + ks * M * stride_cm; the caller reduces (and adds the bias)
    nkb = tl.cdiv(K, BK)
    per = tl.cdiv(nkb, SPLIT_K)
    kb0 = tl.program_id(1) * per
    kb1 = tl.minimum(nkb, kb0 + per)
    if not A_TMA:
        a_ptrs += kb0 * BK
    if not B_TMA:
        b_ptrs += kb0 * BK
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(kb0, kb1):
        k_ok = offs_k < K - kb * BK
        if B_TMA:  # b_ptr is a TensorDescriptor over [E, N, K], block [1, BN, BK]; OOB reads are 0
            b = tl.reshape(b_ptr.load([e64.to(tl.int32), pid_n * BN, kb * BK]), (BN, BK)).T
        else:
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        kg = (kb * BK) // 128
        if BN <= 128:
            sb = tl.load(bs_base + kg)                                   # one weight block per tile
        else:
            sb0 = tl.load(bs_base + kg)
            sb1 = tl.load(bs_base + stride_bsn + kg, mask=pid_n * BN + 128 < N, other=0.0)
            sb = tl.where(tl.arange(0, BN) < 128, sb0, sb1)[None, :]     # two 128-row weight blocks
        if A_FP8:
            if A_TMA:  # a_ptr is a TensorDescriptor over [rows, K], block [BM, BK] (rows contiguous)
                a = a_ptr.load([pid_m * BM, kb * BK])
            else:
                a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            sa = tl.load(as_ptr + kg * stride_as + a_row, mask=row_ok, other=0.0)
            if DOT_F32:
                acc += tl.dot(a.to(tl.float32), b.to(tl.float32)) * sa[:, None] * sb
            else:
                acc += tl.dot(a, b) * sa[:, None] * sb
        else:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            if DOT_F32:
                acc += tl.dot(a.to(tl.float32), b.to(tl.float32)) * sb
            else:
                acc += tl.dot(a, b.to(tl.bfloat16)) * sb
        if not A_TMA:
            a_ptrs += BK
        if not B_TMA:
            b_ptrs += BK

    if HAS_BIAS:
        bias = tl.load(bias_ptr + e64 * stride_biase + offs_nc, mask=n_ok, other=0.0).to(tl.float32)
        acc += bias[None, :]

    if EPI == 1:
        v = acc.to(tl.bfloat16).to(tl.float32)                 # gate_up rounds to bf16 like the reference
        gate, up = tl.split(tl.reshape(v, (BM, BN // 2, 2)))  # interleaved columns: even gate, odd up
        h = clamped_swiglu(gate, up, limit, alpha)
        h = h.to(tl.bfloat16)
        offs_h = pid_n * (BN // 2) + tl.arange(0, BN // 2)
        h_mask = row_ok[:, None] & (offs_h < N // 2)[None, :]
        c_ptrs = c_ptr + c_row.to(tl.int64)[:, None] * stride_cm + offs_h[None, :]
        if QUANT_OUT:
            hf = h.to(tl.float32)
            amax = tl.maximum(tl.max(tl.abs(hf), axis=1), SCALE_FLOOR)  # columns past N/2 are 0
            scale = amax / FP8_MAX
            q = (hf / scale[:, None]).to(tl.float8e4nv)
            tl.store(c_ptrs, q, mask=h_mask)
            tl.store(cs_ptr + pid_n * stride_cs + c_row, scale, mask=row_ok)
        else:
            tl.store(c_ptrs, h, mask=h_mask)
    else:
        if EPI == 2:
            w = tl.load(weights_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
            acc = acc * w[:, None]
        c_ptrs = c_ptr + c_row.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        if SPLIT_K > 1:
            c_ptrs += tl.program_id(1).to(tl.int64) * M * stride_cm
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_combine_kernel(y_ptr, ids_ptr, out_ptr, H, offset, num_experts,
                       TOPK: tl.constexpr, BH: tl.constexpr):
    """out[t] = sum over the routes j of token t that landed on this rank of y[t * TOPK + j] (fp32 sum)."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    c_ok = cols < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + j) - offset
        if (e >= 0) & (e < num_experts):
            acc += tl.load(y_ptr + (t * TOPK + j) * H + cols, mask=c_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=c_ok)
