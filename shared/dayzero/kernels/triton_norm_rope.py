"""Triton backend for ``rms_norm`` and ``rope`` (contracts: kernels/torch_ops.py).

Both are memory-bound one-pass kernels that reproduce the torch reference's rounding points:
  * ``rms_norm``: one program per row; ``x`` widened to fp32, ``x * rsqrt(mean(x^2) + eps)``, then
    ``w * that`` in fp32 and one rounding to x.dtype (the reference's order; the only difference is
    the fp32 summation order of ``mean``).
  * ``rope``: one program per token rotates every q head and every k head (one launch for both),
    half-split (NeoX) layout. cos/sin are rounded to q.dtype first and every product and sum is
    rounded to q.dtype, exactly as the reference's bf16 tensor ops do, so bf16 results are bitwise
    equal to the reference (a bf16 x bf16 product is exact in fp32; torch's bf16 ops compute in fp32
    and round once, as here; the roundings are done on the bits, see ``_round_to``). Outputs are
    new contiguous tensors.
No host syncs and no data-dependent shapes: both can be captured in a CUDA graph.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from .registry import register
from .triton_moe_gemm import interpreting

# ``rope`` lets the next grid launched with programmatic dependent launch (the split-KV decode attention) start
# at once instead of when rope ends (``DAYZERO_ROPE_TRIGGER=1``; off by default, session 9 candidate, never run on
# a GPU): every PDL kernel after rope waits for it before reading q / k; the decode presets with ``EARLY_KV`` then
# stream their first K/V tiles while rope runs
ROPE_TRIGGER_ENV = "DAYZERO_ROPE_TRIGGER"


def rope_trigger() -> bool:
    env = os.environ.get(ROPE_TRIGGER_ENV, "0")
    if env not in ("0", "1"):
        raise ValueError(f"{ROPE_TRIGGER_ENV}={env!r}: choose 0 (off) or 1 (on)")
    return env == "1" and not interpreting()


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, r_ptr, s_ptr, H, stride_xt, stride_ot, stride_rt, eps,
                     BLOCK: tl.constexpr, RES: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    x = tl.load(x_ptr + row * stride_xt + cols, mask=ok, other=0.0).to(tl.float32)
    if RES:  # residual add first, rounded to x.dtype as the unfused add; the sum is an output too
        x = (x + tl.load(r_ptr + row * stride_rt + cols, mask=ok, other=0.0).to(tl.float32)).to(
            s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * H + cols, x, mask=ok)
        x = x.to(tl.float32)
    var = tl.sum(x * x, axis=0) / H
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    y = w * (x * tl.rsqrt(var + eps))
    tl.store(o_ptr + row * stride_ot + cols, y.to(o_ptr.dtype.element_ty), mask=ok)


def _norm(x: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor, eps: float, name: str):
    if x.dim() != 2:
        raise ValueError(f"{name}: expected x [T, H], got shape {tuple(x.shape)}")
    T, H = x.shape
    if w.shape != (H,):
        raise ValueError(f"{name}: weight shape {tuple(w.shape)} does not match hidden size {H}")
    if r is not None and (r.shape != x.shape or r.dtype != x.dtype):
        raise ValueError(f"{name}: residual {tuple(r.shape)} {r.dtype} must match x {tuple(x.shape)} {x.dtype}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if r is not None and r.stride(1) != 1:
        r = r.contiguous()
    w = w.contiguous()
    out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    s = torch.empty((T, H), dtype=x.dtype, device=x.device) if r is not None else out
    if T > 0:
        block = triton.next_power_of_2(H)
        warps = 4 if block <= 2048 else 8
        _rms_norm_kernel[(T,)](x, w, out, r if r is not None else x, s, H, x.stride(0), out.stride(0),
                               (r if r is not None else x).stride(0), float(eps), BLOCK=block, RES=r is not None,
                               num_warps=warps)
    return s, out


@register("triton", "rms_norm")
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [T,H]``, ``w [H]`` -> ``[T,H]`` in x.dtype (see the torch op)."""
    return _norm(x, None, w, eps, "rms_norm")[1]


@register("triton", "add_rms_norm")
def add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + r, rms_norm(x + r))`` in one launch (see the torch op)."""
    return _norm(x, r, w, eps, "add_rms_norm")


@triton.jit
def _round_to(x, dt: tl.constexpr):
    """fp32 ``x`` rounded to ``dt`` (round to nearest even) and widened back to fp32. For bf16 the
    rounding is done on the bits (finite values): with ``.to(bf16).to(fp32)`` between the products
    and the sums, the H200 build differed from the reference by one ulp in some elements (run of
    2026-11-30, bench/NOTES.md), presumably a multiply and an add fused across the round trip."""
    if dt == tl.bfloat16:
        u = x.to(tl.uint32, bitcast=True)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        y = u.to(tl.float32, bitcast=True)
    elif dt == tl.float32:
        y = x
    else:
        y = x.to(dt).to(tl.float32)
    return y


@triton.jit
def _rotate(src_ptr, dst_ptr, t, stride_t, stride_h, nh, c, s,
            HALF: tl.constexpr, H_P2: tl.constexpr, HALF_P2: tl.constexpr):
    """Rotate the ``nh`` heads of token ``t``: [H, D] = [x1 | x2] -> [x1*c - x2*s | x2*c + x1*s]."""
    hh = tl.arange(0, H_P2)[:, None]
    dd = tl.arange(0, HALF_P2)[None, :]
    m = (hh < nh) & (dd < HALF)
    base = src_ptr + t * stride_t + hh * stride_h + dd
    x1 = tl.load(base, mask=m, other=0.0)
    x2 = tl.load(base + HALF, mask=m, other=0.0)
    dt = src_ptr.dtype.element_ty
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    # every product and sum rounded to the activation dtype, as the reference's tensor ops do
    a = _round_to(x1 * c, dt)
    b = _round_to(x2 * s, dt)
    e = _round_to(x2 * c, dt)
    f = _round_to(x1 * s, dt)
    out = dst_ptr + t * (nh * 2 * HALF) + hh * (2 * HALF) + dd        # dst is contiguous [T, nh, D]
    tl.store(out, (a - b).to(dt), mask=m)
    tl.store(out + HALF, (e + f).to(dt), mask=m)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, pos_ptr,
                 stride_qt, stride_qh, stride_kt, stride_kh, stride_cp, HQ, HKV,
                 HALF: tl.constexpr, HALF_P2: tl.constexpr, HQ_P2: tl.constexpr, HKV_P2: tl.constexpr,
                 TRIGGER: tl.constexpr = False):
    if TRIGGER:   # the dependent PDL grid may launch now (it waits for this grid before reading q / k)
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    dd = tl.arange(0, HALF_P2)[None, :]
    dm = dd < HALF
    dt = q_ptr.dtype.element_ty
    c = _round_to(tl.load(cos_ptr + p * stride_cp + dd, mask=dm, other=0.0), dt)  # [1, D/2]
    s = _round_to(tl.load(sin_ptr + p * stride_cp + dd, mask=dm, other=0.0), dt)
    _rotate(q_ptr, qo_ptr, t, stride_qt, stride_qh, HQ, c, s, HALF, HQ_P2, HALF_P2)
    _rotate(k_ptr, ko_ptr, t, stride_kt, stride_kh, HKV, c, s, HALF, HKV_P2, HALF_P2)


@register("triton", "rope")
def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[T,Hq,D]``, k ``[T,Hkv,D]``, cos/sin ``[P,D/2]`` fp32, positions ``[T]`` -> new (q, k)."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"rope: q {tuple(q.shape)} and k {tuple(k.shape)} must be [T, Hq, D] and [T, Hkv, D]")
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    if D % 2 or cos.dim() != 2 or cos.shape[1] != D // 2 or sin.shape != cos.shape:
        raise ValueError(f"rope: cos {tuple(cos.shape)} / sin {tuple(sin.shape)} must be [P, {D // 2}]")
    if positions.shape != (T,):
        raise ValueError(f"rope: positions must be [{T}], got {tuple(positions.shape)}")
    if k.dtype != q.dtype:
        raise ValueError(f"rope (triton): q and k must share a dtype, got {q.dtype} and {k.dtype}")
    if q.stride(2) != 1:
        q = q.contiguous()
    if k.stride(2) != 1:
        k = k.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    qo = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    ko = torch.empty((T, Hkv, D), dtype=k.dtype, device=k.device)
    if T == 0:
        return qo, ko
    half = D // 2
    _rope_kernel[(T,)](q, k, qo, ko, cos, sin, positions,
                       q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), Hq, Hkv,
                       HALF=half, HALF_P2=triton.next_power_of_2(half), HQ_P2=triton.next_power_of_2(Hq),
                       HKV_P2=triton.next_power_of_2(Hkv), TRIGGER=rope_trigger(), num_warps=4)
    return qo, ko
