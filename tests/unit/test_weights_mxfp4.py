"""MXFP4 dequantization equals transformers' own, bit for bit, on every expert tensor."""

from __future__ import annotations

import pytest
import torch

from dayzero.weights.hf_reader import HFCheckpoint
from dayzero.weights.mxfp4 import FP4_E2M1_VALUES, dequantize_mxfp4
from dayzero.weights.safetensors_io import load_tensor

mxfp4_hf = pytest.importorskip("transformers.integrations.mxfp4")


@pytest.mark.parametrize("preset", ["tiny", "tiny2"])
def test_bit_exact_vs_transformers(make_ckpt, preset):
    ckpt = HFCheckpoint(make_ckpt(preset))
    checked = 0
    for name, info in ckpt.tensors.items():
        if not name.endswith("_blocks"):
            continue
        blocks = load_tensor(info)
        scales = load_tensor(ckpt.tensors[name.replace("_blocks", "_scales")])
        for dtype in (torch.float32, torch.bfloat16):
            ours = dequantize_mxfp4(blocks, scales, dtype, rows_per_chunk=1000)  # [E, rows, cols]
            theirs = mxfp4_hf.convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # [E, cols, rows]
            theirs = theirs.transpose(1, 2)
            assert ours.dtype == theirs.dtype == dtype
            assert ours.shape == theirs.shape
            # bit for bit (also tells -0.0 from +0.0)
            assert torch.equal(ours.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                               theirs.contiguous().view(torch.int16 if dtype == torch.bfloat16 else torch.int32)), name
        checked += 1
    assert checked == 2 * ckpt.config.num_hidden_layers


def test_nibble_order_and_scale():
    # byte 0x21: low nibble 1 (0.5) is element 0, high nibble 2 (1.0) is element 1; scale 2^(130-127) = 8
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0] = 0x21
    blocks[0, 0, 15] = 0xF8  # element 30: code 8 (-0.0), element 31: code 15 (-6.0)
    out = dequantize_mxfp4(blocks, torch.tensor([[130]], dtype=torch.uint8))
    assert out.shape == (1, 32)
    assert out[0, 0] == 0.5 * 8 and out[0, 1] == 1.0 * 8
    assert out[0, 31] == FP4_E2M1_VALUES[15] * 8
    assert torch.signbit(out[0, 30])


def test_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        dequantize_mxfp4(torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8))
    with pytest.raises(TypeError):
        dequantize_mxfp4(torch.zeros(2, 16), torch.zeros(2, dtype=torch.uint8))
