"""Torch reference ops (the oracle of the GPU backends): contracts the model relies on."""

from __future__ import annotations

import torch

from dayzero.config import preset
from dayzero.kernels.registry import get_ops
from dayzero.kernels.types import ExpertWeights, LinearWeight
from dayzero.model.rope import build_rope_tables
from dayzero.weights.fp8 import quantize_weight_block

ops = get_ops("torch")


def _g(seed):
    return torch.Generator().manual_seed(seed)


def test_rope_tables_match_transformers():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    cfg = preset("20b")
    hf_cfg = GptOssConfig(**{k: v for k, v in cfg.to_hf_dict().items() if k != "quantization_config"})
    rot = GptOssRotaryEmbedding(hf_cfg)
    pos = torch.tensor([0, 1, 127, 4095, 4096, 4097, 30000, 131071])
    x = torch.zeros(1, len(pos), cfg.head_dim)
    cos, sin = rot(x, pos[None])
    tables = build_rope_tables(cfg)
    assert torch.equal(tables.cos[pos], cos[0]) and torch.equal(tables.sin[pos], sin[0])


def test_fp8_linear_partial_blocks_and_prequantized_input():
    N, K, T = 200, 320, 5  # 200 = 128 + 72 rows, 320 = 2*128 + 64 columns
    w = torch.randn(N, K, generator=_g(0)) / K ** 0.5
    b = torch.randn(N, generator=_g(1))
    x = torch.randn(T, K, generator=_g(2)).to(torch.bfloat16)
    q, s = quantize_weight_block(w)
    dense = ops.linear(x.float(), LinearWeight(w, b))
    fp8 = ops.linear(x, LinearWeight(q, b.to(torch.bfloat16), s))
    assert fp8.dtype == torch.bfloat16 and fp8.shape == (T, N)
    assert float((fp8.float() - dense).abs().max() / dense.abs().max()) < 0.05
    # norm fused with activation quantization == norm, then quantization inside linear
    nw = torch.rand(K, generator=_g(3)) + 0.5
    xq, xs = ops.rms_norm_quant(x, nw, 1e-5)
    assert xq.dtype == torch.float8_e4m3fn and xs.shape == (T, 3)
    lw = LinearWeight(q, b.to(torch.bfloat16), s)
    assert torch.equal(ops.linear(xq, lw, xs), ops.linear(ops.rms_norm(x, nw, 1e-5), lw))


def test_router_topk_dtype_follows_logits():
    logits = torch.randn(7, 8, generator=_g(4))
    for dt in (torch.float32, torch.bfloat16):
        w, ids = ops.router_topk(logits.to(dt), 3)
        assert w.dtype == dt and ids.dtype == torch.int64
        assert torch.equal(ids, logits.to(dt).topk(3).indices)
        assert torch.allclose(w.float().sum(-1), torch.ones(7), atol=1e-2)


def _experts(E=6, H=64, I=32, seed=5):
    g = _g(seed)
    return ExpertWeights(gate_up=torch.randn(E, 2 * I, H, generator=g) / 4, gate_up_bias=torch.randn(E, 2 * I, generator=g),
                         down=torch.randn(E, H, I, generator=g) / 4, down_bias=torch.randn(E, H, generator=g))


def test_moe_experts_matches_per_token_formula_and_ep_split():
    ex = _experts()
    T, k = 9, 2
    x = torch.randn(T, 64, generator=_g(6))
    w, ids = ops.router_topk(torch.randn(T, 6, generator=_g(7)), k)
    out = ops.moe_experts(x, w, ids, ex, 7.0)
    # per token, per route, straight from DESIGN §2
    want = torch.zeros(T, 64)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            gu = ex.gate_up[e] @ x[t] + ex.gate_up_bias[e]
            gate, up = gu[0::2].clamp(max=7.0), gu[1::2].clamp(-7.0, 7.0)
            h = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            want[t] += w[t, j] * (ex.down[e] @ h + ex.down_bias[e])
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5)
    # EP: two ranks with 3 experts each, global ids; their partial outputs sum to the whole
    parts = []
    for r in range(2):
        sl = slice(3 * r, 3 * r + 3)
        part = ExpertWeights(ex.gate_up[sl], ex.gate_up_bias[sl], ex.down[sl], ex.down_bias[sl],
                             derived={"expert_offset": 3 * r})
        parts.append(ops.moe_experts(x, w, ids, part, 7.0))
    assert torch.allclose(parts[0] + parts[1], out, rtol=1e-5, atol=1e-5)
