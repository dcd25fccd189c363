"""Epilogue pieces of the 128-row Gluon MoE GEMM (``gluon_moe_gemm128``), one consumer warpgroup's
64 rows x one 128-wide weight block at a time: clamped SwiGLU of the gate_up columns, the FP8 store of
h, the down GEMM's scaled scatter of y, and ``_pin`` (keeps a promotion ahead of the next wgmma); the
FAST variants (``GluonConfig.fast_epi``) drop the range guards of the sigmoid's exp / division.
Imported only with ``gluon_moe_gemm128`` (Gluon path selected).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

HM = gl.constexpr(64)     # rows per consumer warpgroup
WN = gl.constexpr(128)    # one weight block of columns


@gluon.jit
def _pin(x):
    """x unchanged, through a volatile no-op: the compiler may not sink the promotion that makes x past the
    next wgmma (both 64x128 results live at once: 256 registers, spills)."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _ex2_ftz(x):
    """2^x, MUFU.EX2 alone (``gl.exp`` lowers to ``ex2.approx.f32``, which wraps it in a subnormal-range guard:
    3 more instructions an element; results differ only where 2^x is subnormal)."""
    return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _rcp_ftz(x):
    """1 / x, MUFU.RCP alone (what ``div.full.f32`` multiplies by for |x| <= 2^126, less its range guard)."""
    return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _swiglu(acc, bias, n_ok, limit, alpha, FAST: gl.constexpr = False):
    """[HM, WN] gate_up columns (interleaved gate/up) -> h [HM, WN // 2], rounded like the reference.
    FAST: the sigmoid as MUFU.EX2 and MUFU.RCP without the subnormal / huge-operand guards of ``gl.exp``
    and the ``/`` (div.full.f32 = x * rcp(y) for |y| <= 2^126): bitwise the same h unless gate < -51
    (there both round to a |h| below 1e-35, quantized to 0 either way)."""
    v = (acc + gl.expand_dims(bias, 0)).to(gl.bfloat16).to(gl.float32)
    v = gl.where(gl.expand_dims(n_ok, 0), v, 0.0)
    gate, up = gl.split(gl.reshape(v, [HM, WN // 2, 2]))
    gate = gl.minimum(gate, limit)
    up = gl.minimum(gl.maximum(up, -limit), limit)
    if FAST:   # the same operations in the same order; gl.exp(x) is ex2(x * log2(e))
        h = (up + 1.0) * (gate * _rcp_ftz(1.0 + _ex2_ftz((-alpha * gate) * 1.4426950408889634)))
    else:
        h = (up + 1.0) * (gate / (1.0 + gl.exp(-alpha * gate)))
    return h.to(gl.bfloat16).to(gl.float32)


@gluon.jit
def _store_h(h, scale, om, row_ok, oh, N, c_ptr, stride_cm, st: gl.constexpr, FAST: gl.constexpr = False,
             ZPAD: gl.constexpr = False):
    """h [HM, 64] / scale [HM] -> FP8 rows of c. FAST: h * rcp(scale) (scale = amax / 448 lies in
    [2e-13, 8e35], where that is what the division computes). ZPAD: padding rows (row_ok false) written as
    zeros instead of skipped (the down GEMM multiplies them: zeros draw less power than stale data)."""
    if FAST:
        q = gl.convert_layout(h, st) * gl.expand_dims(_rcp_ftz(scale), 1)
    else:
        q = gl.convert_layout(h, st) / gl.expand_dims(scale, 1)
    if ZPAD:
        q = gl.where(gl.expand_dims(row_ok, 1), q, 0.0)
        ok = gl.expand_dims(om >= 0, 1) & gl.expand_dims(oh < N // 2, 0)
    else:
        ok = gl.expand_dims(row_ok, 1) & gl.expand_dims(oh < N // 2, 0)
    ptrs = c_ptr + gl.expand_dims(om.to(gl.int64) * stride_cm, 1) + gl.expand_dims(oh, 0)
    gl.store(ptrs, q.to(gl.float8e4nv), mask=ok)


@gluon.jit
def _store_hs(cs_ptr, scale, om, row_ok):
    """The rows' h scales (one 1x128 group) with ZPAD: padding rows get 0 (their h rows are zeros)."""
    gl.store(cs_ptr + om, gl.where(row_ok, scale, 0.0))


@gluon.jit
def _store_y(acc, bias, w, prow, on, N, num_pairs, c_ptr, stride_cm, st2: gl.constexpr):
    """y rows of one weight block: (acc [HM, WN] + b2) * routing weight (mma layout), bf16, then the
    store layout; rows scattered to pair order ``prow`` [HM]."""
    out = (acc + gl.expand_dims(bias, 0)) * gl.expand_dims(w, 1)
    out = gl.convert_layout(out.to(c_ptr.dtype.element_ty), st2)
    ok = gl.expand_dims(prow < num_pairs, 1) & gl.expand_dims(on < N, 0)
    ptrs = c_ptr + gl.expand_dims(prow.to(gl.int64) * stride_cm, 1) + gl.expand_dims(on, 0)
    gl.store(ptrs, out, mask=ok)
