"""GPT-OSS's clamped SwiGLU as one Triton function, shared by every MoE gate_up epilogue (prefill and decode)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def clamped_swiglu(gate, up, limit, alpha):
    """(up + 1) * gate * sigmoid(alpha * gate) with gate clamped above at limit and up to [-limit, limit]
    (``torch_ops.swiglu``'s numbers, elementwise on any shape)."""
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    return (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
