"""The engine's gpt-oss transformer: what the services run.

Parameter names are the canonical checkpoint names (HF module names), plus ``<name>_scale`` for
the fp32 block scales of FP8 parameters, so loading is a name lookup and a per-parameter
``weight_loader`` (see ``dayzero.weights.loader``). All math goes through the kernel ops of one
backend, chosen at construction.

    x = embed(ids)                                    # [T, H]
    for each layer: x += attn(rmsnorm(x)); x += moe(rmsnorm(x))   # each add fused into the next norm
    hidden = rmsnorm(x); logits = lm_head(hidden)     # [N, V] for the N rows asked for
"""

from __future__ import annotations

import os

import torch
from torch import nn

from dayzero.config import ModelConfig
from dayzero.kernels.registry import Ops, get_ops

from .attention import Attention, ForwardBatch
from .layers import Linear, ParallelConfig, Precision, RMSNorm, plain_param
from .moe import MoE
from .rope import build_rope_tables


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, prec: Precision, par: ParallelConfig, device,
                 fuse_qkv: bool = True) -> None:
        super().__init__()
        pre = f"model.layers.{layer}"
        self.fp8 = prec.fp8
        self.input_layernorm = RMSNorm(f"{pre}.input_layernorm", cfg.hidden_size, cfg.rms_norm_eps, device)
        self.self_attn = Attention(cfg, layer, prec, par, device, fuse_qkv)
        self.post_attention_layernorm = RMSNorm(f"{pre}.post_attention_layernorm", cfg.hidden_size,
                                                cfg.rms_norm_eps, device)
        self.mlp = MoE(cfg, layer, prec, par, device)

    def forward(self, ops: Ops, x: torch.Tensor, delta: torch.Tensor | None, fb: ForwardBatch,
                rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual stream ``x [T,H]`` plus the previous layer's pending MoE output ``delta`` (None
        for the first layer) -> (stream, this layer's MoE output). Each residual add runs inside
        the norm after it (one launch for add + norm [+ FP8 quantization])."""
        n1 = self.input_layernorm
        if self.fp8:  # norm fused with the 1x128 activation quantization the FP8 q/k/v GEMMs need
            if delta is None:
                h, h_scale = ops.rms_norm_quant(x, n1.weight, n1.eps)
            else:
                x, h, h_scale = ops.add_rms_norm_quant(x, delta, n1.weight, n1.eps)
        else:
            h_scale = None
            if delta is None:
                h = ops.rms_norm(x, n1.weight, n1.eps)
            else:
                x, h = ops.add_rms_norm(x, delta, n1.weight, n1.eps)
        n2 = self.post_attention_layernorm
        x, h = ops.add_rms_norm(x, self.self_attn(ops, h, h_scale, fb, rope), n2.weight, n2.eps)
        return x, self.mlp(ops, h)


class _Body(nn.Module):
    def __init__(self, cfg: ModelConfig, prec: Precision, par: ParallelConfig, device, fuse_qkv: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = plain_param("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size),
                                               prec.act, device)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, prec, par, device, fuse_qkv) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm("model.norm", cfg.hidden_size, cfg.rms_norm_eps, device)


class GptOssForEngine(nn.Module):
    """gpt-oss for serving. ``dtype``: float32 | bfloat16 | fp8; ``backend``: a kernel registry name.

    Build it on its final device; load weights with ``dayzero.weights.loader.load_weights``.
    ``fuse_qkv``: q/k/v projections as one GEMM over a stacked weight (default; env DAYZERO_FUSED_QKV=0 off).
    """

    def __init__(self, cfg: ModelConfig, dtype: str = "bfloat16", backend: str = "torch",
                 device: torch.device | str = "cpu", parallel: ParallelConfig | None = None,
                 max_positions: int | None = None, fuse_qkv: bool | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.precision = Precision(dtype)
        self.parallel = par = parallel or ParallelConfig()
        self.device = torch.device(device)
        self.ops: Ops = get_ops(backend, str(self.device))
        if fuse_qkv is None:  # DAYZERO_FUSED_QKV=0: three q/k/v GEMMs (side-by-side benchmarks)
            fuse_qkv = os.environ.get("DAYZERO_FUSED_QKV", "1") != "0"
        self.model = _Body(cfg, self.precision, par, self.device, fuse_qkv)
        self.lm_head = Linear("lm_head", cfg.hidden_size, cfg.vocab_size, False, self.precision.act,
                              self.precision.fp8, self.device)
        self.rope = build_rope_tables(cfg, max_positions, self.device)

    @property
    def act_dtype(self) -> torch.dtype:
        return self.precision.act

    @property
    def max_positions(self) -> int:
        return self.rope.max_positions

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """input_ids ``[T]`` int64 -> final-normed hidden states ``[T, H]`` (act dtype); writes the new
        tokens' K/V into the paged cache described by ``fb``. No host sync: the caller keeps positions
        below ``max_positions`` (the model runner checks)."""
        x = self.model.embed_tokens.weight[input_ids]                                # [T, H]
        delta = None
        for layer in self.model.layers:
            x, delta = layer(self.ops, x, delta, fb, self.rope)
        n = self.model.norm
        if delta is None:
            return self.ops.rms_norm(x, n.weight, n.eps)
        return self.ops.add_rms_norm(x, delta, n.weight, n.eps)[1]

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[N, H]`` -> logits ``[N, V]`` float32."""
        return self.ops.linear(hidden, self.lm_head.lw).float()
