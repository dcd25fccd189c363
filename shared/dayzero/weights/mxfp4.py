"""MXFP4 (OCP microscaling FP4) dequantization of the gpt-oss expert weights.

HF layout: ``*_blocks`` uint8 [..., G, 16] holds 32 FP4 e2m1 values per block, two per byte, the
element with the even index in the LOW nibble; ``*_scales`` uint8 [..., G] is an e8m0 exponent
(value = 2 ** (byte - 127)) shared by the 32 values of its block. Dequantized rows are the
concatenation of the blocks: [..., G * 32]. For ``gate_up_proj_blocks`` [E, 2I, H/32, 16] that is
the (out, in) matrix [E, 2I, H]; HF transformers additionally transposes to its [E, H, 2I].
"""

from __future__ import annotations

import math

import torch

# e2m1 code -> value; bit 3 is the sign
FP4_E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                      -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E8M0_BIAS = 127
BLOCK_VALUES = 32  # FP4 values per scale
BLOCK_BYTES = 16


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32,
                     rows_per_chunk: int = 1 << 20) -> torch.Tensor:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> dtype [..., G * 32].

    Works on chunks of ``rows_per_chunk`` blocks so the int64 index temporaries stay small.
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != BLOCK_BYTES or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}")
    *prefix, groups, _ = blocks.shape
    n = math.prod(prefix) * groups
    flat_blocks = blocks.reshape(n, BLOCK_BYTES)
    flat_scales = scales.reshape(n)
    lut = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    out = torch.empty(n, BLOCK_VALUES, dtype=dtype, device=blocks.device)
    for r0 in range(0, n, rows_per_chunk):
        r1 = min(n, r0 + rows_per_chunk)
        b = flat_blocks[r0:r1]                                   # [R, 16]
        vals = torch.empty(r1 - r0, BLOCK_BYTES, 2, dtype=torch.float32, device=blocks.device)
        vals[..., 0] = lut[(b & 0x0F).long()]                    # even elements: low nibble
        vals[..., 1] = lut[(b >> 4).long()]                      # odd elements: high nibble
        exp = flat_scales[r0:r1].to(torch.int32) - E8M0_BIAS     # [R]
        # multiply by an exact power of two (FP4 values have 2 significant bits: exact in fp32/bf16)
        vals = torch.ldexp(vals.reshape(r1 - r0, BLOCK_VALUES), exp[:, None].to(torch.float32))
        out[r0:r1] = vals.to(dtype)
    return out.reshape(*prefix, groups * BLOCK_VALUES)


def mxfp4_shapes(rows: int, cols: int) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """(blocks shape, scales shape) of one expert's [rows, cols] matrix."""
    if cols % BLOCK_VALUES:
        raise ValueError(f"MXFP4 needs the input dimension ({cols}) to be a multiple of {BLOCK_VALUES}")
    return (rows, cols // BLOCK_VALUES, BLOCK_BYTES), (rows, cols // BLOCK_VALUES)
