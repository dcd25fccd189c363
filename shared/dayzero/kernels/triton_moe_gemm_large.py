"""Large-M (prefill) FP8 grouped GEMM of the fused MoE: both operands by TMA, 1x128 x 128x128 block
scaling promoted to fp32 after every 128-wide K step, expert-sorted rows from ``triton_moe_align``.

The default (``triton_moe.LARGE``: one 64x256 gate_up dot, 8 warps, 3 stages; 64x128 down, 4 warps)
runs ~5 % faster than ``triton_moe_gemm.moe_gemm_kernel`` (which stays the small-M / dense / pointer
gather kernel and the fallback when TMA cannot take the operands): 215 / 150 registers instead of
255 / 198, so down fits 3 programs per SM. Options, each measured (bench/NOTES.md, MoE runs 5-8):
  * ``SPLIT_N = 2``: a 256-wide tile as two 128-wide dots, each inside one weight block, so a K
    step's scale is a per-row vector. No faster on its own.
  * ``RESCALE``: one register tile per accumulator, ``acc = dot(a, b, acc * (p / s))``. Faster gate_up
    at 4 warps (2 programs per SM) but NOT accurate enough: the whole K sum then runs in the tensor
    core's reduced-precision FP8 accumulator (the reason block scaling promotes per K step); the GPU
    tests' bound vs the torch FP8 reference fails. Needs every dot 128 wide or less.
  * ``PIPE``: issue the dots of step k+1 before promoting step k. Slower as Triton emits it (the wait
    still follows the new dot; ptxas overlaps only sometimes).
  * ``PERSISTENT`` (+ ``FLATTEN``): NUM_PROGS programs walk the tiles of the non-empty M blocks
    (counted on the device from ``block_expert``, no host sync). Helps only with ``RESCALE``.
Epilogues as in ``moe_gemm_kernel``: EPI 1 = gate_up (``+ b1``, bf16 round, clamped SwiGLU on the
interleaved columns, FP8 1x128 quantization of h: BN must be 256 = one 128-wide h group); EPI 2 =
down (``(+ b2) * routing weight``, rows scattered to pair order).

Operands: ``a_desc`` TensorDescriptor over A [Mpad, K] fp8, block [BM, BK]; ``as_ptr`` A scales
group-major (row r, group g at ``as_ptr + g * stride_as + r``); ``b_desc`` over W [E, N, K] fp8,
block [1, BN // SPLIT_N, BK]; ``bs_ptr`` W scales [E, ceil(N/128), ceil(K/128)]. Padding rows (sorted
id == num_pairs) compute garbage that is never stored; rows of empty blocks are never touched.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_swiglu import clamped_swiglu

FP8_MAX = tl.constexpr(448.0)
SCALE_FLOOR = tl.constexpr(1e-10)


@triton.jit
def _count_used_blocks(block_expert_ptr, num_blocks, CH: tl.constexpr):
    """Number of non-empty M blocks (the used ones come first, then -1s)."""
    n = 0
    for b0 in range(0, num_blocks, CH):
        b = b0 + tl.arange(0, CH)
        n += tl.sum((tl.load(block_expert_ptr + b, mask=b < num_blocks, other=-1) >= 0).to(tl.int32))
    return n


@triton.jit
def _swizzle(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    width = GROUP_M * num_pid_n
    group = tile // width
    first_m = group * GROUP_M
    gsize = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % gsize
    pid_n = (tile % width) // gsize
    return pid_m, pid_n


@triton.jit
def _dot(a, b, acc, DOT_F32: tl.constexpr):
    if DOT_F32:  # TRITON_INTERPRET=1: the CPU interpreter mis-multiplies fp8 dots
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _swiglu(acc, bias_ptr, offs_n, N, limit, alpha, BM: tl.constexpr, BNS: tl.constexpr):
    """acc [BM, BNS] fp32 (interleaved gate/up columns) -> h [BM, BNS // 2] (bf16 values in fp32)."""
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    v = (acc + bias[None, :]).to(tl.bfloat16).to(tl.float32)  # gate_up rounds to bf16 like the reference
    gate, up = tl.split(tl.reshape(v, (BM, BNS // 2, 2)))
    h = clamped_swiglu(gate, up, limit, alpha)
    return h.to(tl.bfloat16).to(tl.float32)              # columns past N are exactly 0


@triton.jit
def _down_store(acc, bias_ptr, offs_n, N, w, c_ptr, c_row, row_ok, stride_cm):
    n_ok = offs_n < N
    bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    out = (acc + bias[None, :]) * w[:, None]
    ptrs = c_ptr + c_row.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(ptrs, out.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _load_step(a_desc, as_ptr, b_desc, bs_base, pid_m, e, n0, N, kb, offs_m, stride_as, stride_bsn,
               SPLIT_N: tl.constexpr, BNS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """Operands of K step kb: A [BM, BK], W halves b0/b1 [BK, BNS] and the scale of each half as a row
    vector r [BM] and, for a 256-wide half (two weight blocks), a column vector c [BNS] (else c = r)."""
    k0 = kb * BK
    kg = k0 // 128
    a = a_desc.load([pid_m * BM, k0])
    sa = tl.load(as_ptr + kg * stride_as + offs_m)                   # sorted rows: always in bounds
    b0 = tl.reshape(b_desc.load([e, n0, k0]), (BNS, BK)).T           # OOB reads are 0
    sb0 = tl.load(bs_base + kg)
    if BNS > 128:
        sb1 = tl.load(bs_base + stride_bsn + kg, mask=n0 + 128 < N, other=1.0)
        c0 = tl.where(tl.arange(0, BNS) < 128, sb0, sb1)
        r0 = sa
    else:
        r0 = sa * sb0
        c0 = r0
    b1 = b0
    r1 = r0
    c1 = c0
    if SPLIT_N == 2:
        b1 = tl.reshape(b_desc.load([e, n0 + BNS, k0]), (BNS, BK)).T
        r1 = sa * tl.load(bs_base + ((n0 + BNS) // 128 - n0 // 128) * stride_bsn + kg, mask=n0 + BNS < N,
                          other=1.0)
    return a, b0, b1, r0, c0, r1, c1


@triton.jit
def _promote(acc, d, r, c, WIDE: tl.constexpr):
    """acc += d * scale: per row (r) for a half inside one weight block, per row x column if WIDE."""
    if WIDE:
        return acc + d * (r[:, None] * c[None, :])
    return acc + d * r[:, None]


@triton.jit
def _tile(a_desc, as_ptr, b_desc, bs_ptr, bias_ptr, c_ptr, cs_ptr, sorted_ids_ptr, weights_ptr,
          pid_m, pid_n, e, N, K, num_pairs, stride_as, stride_bse, stride_bsn, stride_biase,
          stride_cm, stride_cs, limit, alpha,
          EPI: tl.constexpr, SPLIT_N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          RESCALE: tl.constexpr, PIPE: tl.constexpr, DOT_F32: tl.constexpr):
    BNS: tl.constexpr = BN // SPLIT_N
    offs_m = pid_m * BM + tl.arange(0, BM)
    n0 = pid_n * BN
    e64 = e.to(tl.int64)
    bs_base = bs_ptr + e64 * stride_bse + (n0 // 128) * stride_bsn      # BNS divides 128, or is 256
    acc0 = tl.zeros((BM, BNS), dtype=tl.float32)
    acc1 = tl.zeros((BM, BNS), dtype=tl.float32)
    # RESCALE: acc holds the sum divided by the last step's scale p; scale factors are >= 1e-10/448
    # each, so the quotients stay far inside fp32's range (accuracy: see the module docstring).
    p0 = tl.full((BM,), 1.0, tl.float32)
    p1 = tl.full((BM,), 1.0, tl.float32)
    nk = tl.cdiv(K, BK)
    WIDE: tl.constexpr = BNS > 128
    if RESCALE:  # (BNS <= 128 only)
        for kb in range(0, nk):
            a, b0, b1, s0, c0, s1, c1 = _load_step(a_desc, as_ptr, b_desc, bs_base, pid_m, e, n0, N, kb, offs_m,
                                                   stride_as, stride_bsn, SPLIT_N, BNS, BM, BK)
            if SPLIT_N == 2:  # both accumulators rescaled before either dot is issued (else wgmma serialises)
                x0 = acc0 * (p0 / s0)[:, None]
                x1 = acc1 * (p1 / s1)[:, None]
                acc0 = _dot(a, b0, x0, DOT_F32)
                acc1 = _dot(a, b1, x1, DOT_F32)
                p1 = s1
            else:
                acc0 = _dot(a, b0, acc0 * (p0 / s0)[:, None], DOT_F32)
            p0 = s0
    elif PIPE:  # the dots of step k+1 are issued before step k's promotion (two product tiles live)
        a, b0, b1, r0, c0, r1, c1 = _load_step(a_desc, as_ptr, b_desc, bs_base, pid_m, e, n0, N, 0, offs_m,
                                               stride_as, stride_bsn, SPLIT_N, BNS, BM, BK)
        d0 = _dot(a, b0, None, DOT_F32)
        d1 = d0
        if SPLIT_N == 2:
            d1 = _dot(a, b1, None, DOT_F32)
        for kb in range(1, nk):
            a, b0, b1, t0, u0, t1, u1 = _load_step(a_desc, as_ptr, b_desc, bs_base, pid_m, e, n0, N, kb, offs_m,
                                                   stride_as, stride_bsn, SPLIT_N, BNS, BM, BK)
            nd0 = _dot(a, b0, None, DOT_F32)
            nd1 = nd0
            if SPLIT_N == 2:
                nd1 = _dot(a, b1, None, DOT_F32)
                acc1 = _promote(acc1, d1, r1, c1, WIDE)
            acc0 = _promote(acc0, d0, r0, c0, WIDE)
            d0, d1, r0, c0, r1, c1 = nd0, nd1, t0, u0, t1, u1
        acc0 = _promote(acc0, d0, r0, c0, WIDE)
        if SPLIT_N == 2:
            acc1 = _promote(acc1, d1, r1, c1, WIDE)
    else:
        for kb in range(0, nk):
            a, b0, b1, r0, c0, r1, c1 = _load_step(a_desc, as_ptr, b_desc, bs_base, pid_m, e, n0, N, kb, offs_m,
                                                   stride_as, stride_bsn, SPLIT_N, BNS, BM, BK)
            acc0 = _promote(acc0, _dot(a, b0, None, DOT_F32), r0, c0, WIDE)
            if SPLIT_N == 2:
                acc1 = _promote(acc1, _dot(a, b1, None, DOT_F32), r1, c1, WIDE)
    if RESCALE:
        acc0 = acc0 * p0[:, None]
        acc1 = acc1 * p1[:, None]

    pair = tl.load(sorted_ids_ptr + offs_m)                               # [BM]; num_pairs = padding
    row_ok = pair < num_pairs
    pair = tl.where(row_ok, pair, 0)
    offs_n = n0 + tl.arange(0, BNS)
    bias_e = bias_ptr + e64 * stride_biase
    if EPI == 1:
        h0 = _swiglu(acc0, bias_e, offs_n, N, limit, alpha, BM, BNS)
        amax = tl.max(tl.abs(h0), axis=1)
        if SPLIT_N == 2:
            h1 = _swiglu(acc1, bias_e, offs_n + BNS, N, limit, alpha, BM, BNS)
            amax = tl.maximum(amax, tl.max(tl.abs(h1), axis=1))
        scale = tl.maximum(amax, SCALE_FLOOR) / FP8_MAX
        offs_h = n0 // 2 + tl.arange(0, BNS // 2)
        c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_h[None, :]
        tl.store(c_ptrs, (h0 / scale[:, None]).to(tl.float8e4nv), mask=row_ok[:, None] & (offs_h < N // 2)[None, :])
        if SPLIT_N == 2:
            tl.store(c_ptrs + BNS // 2, (h1 / scale[:, None]).to(tl.float8e4nv),
                     mask=row_ok[:, None] & (offs_h + BNS // 2 < N // 2)[None, :])
        tl.store(cs_ptr + (n0 // 256) * stride_cs + offs_m, scale, mask=row_ok)
    else:
        w = tl.load(weights_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
        _down_store(acc0, bias_e, offs_n, N, w, c_ptr, pair, row_ok, stride_cm)
        if SPLIT_N == 2:
            _down_store(acc1, bias_e, offs_n + BNS, N, w, c_ptr, pair, row_ok, stride_cm)


@triton.jit
def moe_gemm_large_kernel(
    a_desc, as_ptr, b_desc, bs_ptr, bias_ptr, c_ptr, cs_ptr,
    sorted_ids_ptr, block_expert_ptr, weights_ptr,
    num_blocks_m, N, K, num_pairs,
    stride_as, stride_bse, stride_bsn, stride_biase, stride_cm, stride_cs,
    limit, alpha,
    EPI: tl.constexpr, SPLIT_N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr, PERSISTENT: tl.constexpr = False, NUM_PROGS: tl.constexpr = 1,
    FLATTEN: tl.constexpr = False, RESCALE: tl.constexpr = False, PIPE: tl.constexpr = False,
    DOT_F32: tl.constexpr = False,
):
    num_pid_n = tl.cdiv(N, BN)
    if PERSISTENT:
        used_m = _count_used_blocks(block_expert_ptr, num_blocks_m, 1024)
        for tile in tl.range(tl.program_id(0), used_m * num_pid_n, NUM_PROGS, flatten=FLATTEN):
            pid_m, pid_n = _swizzle(tile, used_m, num_pid_n, GROUP_M)
            e = tl.load(block_expert_ptr + pid_m)
            _tile(a_desc, as_ptr, b_desc, bs_ptr, bias_ptr, c_ptr, cs_ptr, sorted_ids_ptr, weights_ptr,
                  pid_m, pid_n, e, N, K, num_pairs, stride_as, stride_bse, stride_bsn, stride_biase,
                  stride_cm, stride_cs, limit, alpha, EPI, SPLIT_N, BM, BN, BK, RESCALE, PIPE, DOT_F32)
    else:
        pid_m, pid_n = _swizzle(tl.program_id(0), num_blocks_m, num_pid_n, GROUP_M)
        e = tl.load(block_expert_ptr + pid_m)
        if e >= 0:
            _tile(a_desc, as_ptr, b_desc, bs_ptr, bias_ptr, c_ptr, cs_ptr, sorted_ids_ptr, weights_ptr,
                  pid_m, pid_n, e, N, K, num_pairs, stride_as, stride_bse, stride_bsn, stride_biase,
                  stride_cm, stride_cs, limit, alpha, EPI, SPLIT_N, BM, BN, BK, RESCALE, PIPE, DOT_F32)
