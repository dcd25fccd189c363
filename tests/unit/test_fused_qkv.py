"""q/k/v as one GEMM over a stacked weight: the parameters become row views of the stack (so the
checkpoint loads unchanged), the logits match the three-GEMM model, and shapes that cannot share
FP8 scale blocks keep three GEMMs."""

from __future__ import annotations

import pytest
import torch

from dayzero.model.layers import Linear, stack_column_linears
from dayzero.weights.loader import load_model

from test_engine_fp8 import FP8_CFG, _engine_logits


def _load(d: str, dtype: str, fused: bool, monkeypatch):
    monkeypatch.setenv("DAYZERO_FUSED_QKV", "1" if fused else "0")
    return load_model(d, dtype=dtype)


@pytest.mark.parametrize("dtype", ["fp8", "bfloat16"])
def test_fused_qkv_matches_three_gemms(make_ckpt, monkeypatch, dtype):
    d = make_ckpt(FP8_CFG)
    fused, plain = _load(d, dtype, True, monkeypatch), _load(d, dtype, False, monkeypatch)
    for layer in fused.model.layers:
        a = layer.self_attn
        assert a.qkv_lw is not None
        stack = a.qkv_lw.weight
        rows = [a.q_proj.weight.shape[0], a.k_proj.weight.shape[0], a.v_proj.weight.shape[0]]
        assert stack.shape[0] == sum(rows)
        # the loaded parameters are the stack's rows: same memory, same values
        assert a.q_proj.weight.data_ptr() == stack.data_ptr()
        assert a.v_proj.weight.data_ptr() == stack[rows[0] + rows[1]:].data_ptr()
        assert torch.equal(stack[rows[0]:rows[0] + rows[1]].float(), a.k_proj.weight.float())
        if dtype == "fp8":
            assert a.qkv_lw.scale.shape[0] * 128 == stack.shape[0]
            assert torch.equal(a.qkv_lw.scale[rows[0] // 128:(rows[0] + rows[1]) // 128], a.k_proj.weight_scale)
        assert torch.equal(a.qkv_lw.bias[-rows[2]:], a.v_proj.bias)
    for layer in plain.model.layers:
        assert layer.self_attn.qkv_lw is None
    ids = torch.randint(0, FP8_CFG.vocab_size, (96,), generator=torch.Generator().manual_seed(3)).tolist()
    got, want = _engine_logits(fused, ids, chunk=48), _engine_logits(plain, ids, chunk=48)
    torch.testing.assert_close(got, want, rtol=2e-2 if dtype == "bfloat16" else 1e-4, atol=1e-2 if dtype == "bfloat16" else 1e-4)
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) > 0.95


def test_fp8_parts_off_the_scale_blocks_keep_three_gemms():
    # k/v of 64 rows (e.g. 512 over TP 8) cannot own whole 128-row scale blocks of a stack
    lins = [Linear(f"l{i}", 256, n, True, torch.bfloat16, True, "cpu") for i, n in enumerate((256, 64, 64))]
    before = [lin.weight.data_ptr() for lin in lins]
    assert stack_column_linears(lins) is None
    assert [lin.weight.data_ptr() for lin in lins] == before
    # different input sizes never stack
    assert stack_column_linears([Linear("a", 128, 128, False, torch.float32, False, "cpu"),
                                 Linear("b", 256, 128, False, torch.float32, False, "cpu")]) is None


def test_tiny_preset_fp8_falls_back_and_bf16_stacks(make_ckpt, monkeypatch):
    d = make_ckpt("tiny")
    assert _load(d, "fp8", True, monkeypatch).model.layers[0].self_attn.qkv_lw is None
    assert _load(d, "bfloat16", True, monkeypatch).model.layers[0].self_attn.qkv_lw is not None
