"""A slow, plain pure-torch GPT-OSS forward: the oracle every other implementation is tested against.

It recomputes the whole sequence on every call (no KV cache), loops over layers, heads' masks and
experts in the most literal way, and depends on nothing in ``dayzero`` but the config: not on the
engine, not on ``kernels``. DESIGN.md §2 in code:

  x = embed[ids]
  per layer:  x += attn(rmsnorm(x))      q/k/v/o with biases, YaRN RoPE (half split), GQA,
                                         softmax over [q.k / sqrt(D) for visible keys] ++ [sink_h],
                                         sink mass dropped; sliding layers see the last W tokens
              x += moe(rmsnorm(x))       router top-k logits -> softmax over those k;
                                         gate_up rows interleaved (gate even, up odd),
                                         gate <= 7, -7 <= up <= 7, (up + 1) * gate * sigmoid(1.702 gate)
  logits = lm_head(rmsnorm(x))

Computation runs in the dtype of the weights (fp32 for oracle tests); RMSNorm statistics and RoPE
angles are computed in fp32, as HF transformers does.
"""

from __future__ import annotations

import math

import torch

from dayzero.config import ModelConfig

SWIGLU_ALPHA = 1.702


def yarn_inv_freq_and_scale(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """YaRN: per-frequency blend of interpolated (1/(factor*f)) and original (1/f) inverse frequencies,
    with a linear ramp between the correction dims of beta_fast and beta_slow; plus the attention
    scale 0.1 ln(factor) + 1 applied to cos and sin. Returns (inv_freq [D/2] fp32, scale)."""
    r, d = cfg.rope, cfg.head_dim
    pos_freqs = r.theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)     # [D/2]
    inv_extrapolated = 1.0 / pos_freqs
    inv_interpolated = 1.0 / (r.factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        return d * math.log(r.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(r.theta))

    low, high = correction_dim(r.beta_fast), correction_dim(r.beta_slow)
    if r.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep_original = 1 - ramp            # 1: high-frequency dims keep their original frequency
    inv_freq = inv_interpolated * (1 - keep_original) + inv_extrapolated * keep_original
    scale = 0.1 * math.log(r.factor) + 1.0 if r.factor > 1 else 1.0
    return inv_freq, scale


def rotate_half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotation: pairs (i, i + D/2). x [T, heads, D], cos/sin [T, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class ReferenceModel:
    """``ReferenceModel(cfg, state_dict)``; state_dict uses the canonical names of ``hf_reader``."""

    def __init__(self, cfg: ModelConfig, state_dict: dict[str, torch.Tensor]):
        self.cfg = cfg
        self.w = state_dict
        self.dtype = state_dict["model.embed_tokens.weight"].dtype
        self.inv_freq, self.rope_scale = yarn_inv_freq_and_scale(cfg)

    # ---- pieces -----------------------------------------------------------------------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)
        return (weight.float() * y).to(x.dtype)

    def linear(self, x: torch.Tensor, name: str, bias: bool = True) -> torch.Tensor:
        y = x @ self.w[name + ".weight"].to(x.dtype).t()
        return y + self.w[name + ".bias"].to(x.dtype) if bias else y

    def attention(self, i: int, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        cfg, p = self.cfg, f"model.layers.{i}.self_attn."
        T, D, Hq, Hkv = x.shape[0], cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        q = self.linear(x, p + "q_proj").view(T, Hq, D)
        k = self.linear(x, p + "k_proj").view(T, Hkv, D)
        v = self.linear(x, p + "v_proj").view(T, Hkv, D)

        angles = positions.float()[:, None] * self.inv_freq[None, :]        # [T, D/2] fp32
        cos = (angles.cos() * self.rope_scale).to(x.dtype)
        sin = (angles.sin() * self.rope_scale).to(x.dtype)
        q, k = rotate_half_split(q, cos, sin), rotate_half_split(k, cos, sin)

        t_idx = torch.arange(T)[:, None]
        s_idx = torch.arange(T)[None, :]
        visible = s_idx <= t_idx                                            # [T, S] causal
        if cfg.is_sliding(i):
            visible &= (t_idx - s_idx) < cfg.sliding_window                 # itself + W-1 previous
        sinks = self.w[p + "sinks"].to(x.dtype)
        group = Hq // Hkv
        out = torch.empty(T, Hq, D, dtype=x.dtype)
        for h in range(Hq):
            kh, vh = k[:, h // group], v[:, h // group]                     # [S, D]
            scores = (q[:, h] @ kh.t()) * (1.0 / math.sqrt(D))              # [T, S]
            scores = scores.masked_fill(~visible, float("-inf"))
            with_sink = torch.cat([scores, sinks[h].expand(T, 1)], dim=1)   # [T, S + 1]
            probs = torch.softmax(with_sink, dim=-1)[:, :-1]                # sink mass dropped
            out[:, h] = probs @ vh
        return self.linear(out.reshape(T, Hq * D), p + "o_proj")

    def moe(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        cfg, p = self.cfg, f"model.layers.{i}.mlp."
        logits = self.linear(x, p + "router")                               # [T, E]
        top_vals, top_idx = torch.topk(logits, cfg.num_experts_per_tok, dim=-1)
        weights = torch.softmax(top_vals, dim=-1)                           # over the k chosen only
        w1, b1 = self.w[p + "experts.gate_up_proj"], self.w[p + "experts.gate_up_proj_bias"]
        w2, b2 = self.w[p + "experts.down_proj"], self.w[p + "experts.down_proj_bias"]
        out = torch.zeros_like(x)
        limit = cfg.swiglu_limit
        for e in range(cfg.num_local_experts):
            tok, slot = torch.nonzero(top_idx == e, as_tuple=True)          # tokens routed to e
            if tok.numel() == 0:
                continue
            gate_up = x[tok] @ w1[e].to(x.dtype).t() + b1[e].to(x.dtype)   # [n, 2I]
            gate = gate_up[:, 0::2].clamp(max=limit)                        # even rows of W1: gate
            up = gate_up[:, 1::2].clamp(-limit, limit)                      # odd rows: up
            h = (up + 1) * gate * torch.sigmoid(SWIGLU_ALPHA * gate)        # [n, I]
            y = h @ w2[e].to(x.dtype).t() + b2[e].to(x.dtype)               # [n, H]
            out.index_add_(0, tok, weights[tok, slot, None] * y)
        return out

    # ---- forward ----------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [T] -> logits [T, V]. ``positions`` [T] (default 0..T-1) only moves RoPE;
        masks follow the order of the tokens (as when a prompt starts at that position)."""
        input_ids = torch.as_tensor(input_ids).reshape(-1)
        T = input_ids.shape[0]
        positions = torch.arange(T) if positions is None else torch.as_tensor(positions).reshape(-1)
        x = self.w["model.embed_tokens.weight"][input_ids].to(self.dtype)   # [T, H]
        for i in range(self.cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            x = x + self.attention(i, self.rms_norm(x, self.w[p + "input_layernorm.weight"]), positions)
            x = x + self.moe(i, self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"]))
        x = self.rms_norm(x, self.w["model.norm.weight"])
        return x @ self.w["lm_head.weight"].to(self.dtype).t()               # [T, V]

    __call__ = forward
