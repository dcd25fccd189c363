"""Model configs and the error measure shared by the comparisons against HF transformers'
GptOssForCausalLM (test_reference_vs_hf, test_engine_vs_hf)."""

from __future__ import annotations

import torch

from dayzero.config import ModelConfig, preset

TOL = 1e-4  # max|ours - hf| / max|hf|, both fp32

# differs from tiny2 in layers (4 vs 3), experts (8 vs 6), top-k (2 vs 3), GQA ratio and widths
SMALL_B = ModelConfig(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                      num_experts_per_tok=2, eos_token_id=1, pad_token_id=0)
# very small, so that a real > 4096-token prompt stays cheap on CPU
MICRO = ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=4,
                    num_experts_per_tok=2, eos_token_id=1, pad_token_id=0)
CONFIGS = {"tiny2": preset("tiny2"), "small_b": SMALL_B}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b| (``b`` is the reference)."""
    return float((a - b).abs().max() / b.abs().max())
