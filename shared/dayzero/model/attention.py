"""Attention layer of gpt-oss: q/k/v/o projections with biases, YaRN rope, paged attention with
per-head sinks (full or 128-token sliding window), all through kernel ops."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dayzero.config import ModelConfig
from dayzero.kernels.registry import Ops

from .layers import Linear, ParallelConfig, Precision, plain_param, stack_column_linears
from .rope import RopeTables


@dataclass
class ForwardBatch:
    """Everything a forward pass needs besides token ids (built by the model runner).

    The batch is B sequences; sequence b contributes ``cu_seqlens_q[b+1]-cu_seqlens_q[b]`` new tokens
    (a prefill chunk, or 1 for decode) after ``cached_lens[b]`` tokens already in the KV cache.
    """

    positions: torch.Tensor             # [T] int64
    cu_seqlens_q: torch.Tensor          # [B+1] int32
    cached_lens: torch.Tensor           # [B] int32
    block_tables_full: torch.Tensor     # [B, MB] int32
    block_tables_sliding: torch.Tensor  # [B, MB] int32 (logical j -> ring[j % R])
    slots_full: torch.Tensor            # [T] int64 (-1: do not store)
    slots_sliding: torch.Tensor         # [T] int64 (-1: older than the window, not stored)
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k_cache, v_cache) [NB, BS, Hkv, D]
    # host-known bounds passed to attention ops that take them (not the torch op), so the op needs
    # no host sync (CUDA graphs): largest new-token count, largest cached length of the batch
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None

    def attention_hints(self) -> dict[str, int]:
        return {k: v for k, v in (("max_seqlen_q", self.max_seqlen_q), ("max_seqlen_k", self.max_seqlen_k))
                if v is not None}


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, prec: Precision, par: ParallelConfig, device,
                 fuse_qkv: bool = True) -> None:
        super().__init__()
        pre = f"model.layers.{layer}.self_attn"
        tp = par.tp_size
        if cfg.num_key_value_heads % tp:
            raise ValueError(f"{cfg.num_key_value_heads} KV heads cannot be split over TP={tp}")
        self.layer = layer
        self.par = par
        self.num_heads = cfg.num_attention_heads // tp
        self.num_kv_heads = cfg.num_key_value_heads // tp
        self.head_dim = D = cfg.head_dim
        self.scale = D ** -0.5
        self.window = cfg.sliding_window if cfg.is_sliding(layer) else 0
        col = ("column", par.tp_rank, tp)
        H = cfg.hidden_size
        self.q_proj = Linear(f"{pre}.q_proj", H, cfg.q_size, True, prec.act, prec.fp8, device, col)
        self.k_proj = Linear(f"{pre}.k_proj", H, cfg.kv_size, True, prec.act, prec.fp8, device, col)
        self.v_proj = Linear(f"{pre}.v_proj", H, cfg.kv_size, True, prec.act, prec.fp8, device, col)
        self.o_proj = Linear(f"{pre}.o_proj", cfg.q_size, H, True, prec.act, prec.fp8, device,
                             ("row", par.tp_rank, tp))
        # q, k and v in one GEMM (their parameters become row views of one stack); None: three GEMMs
        self.qkv_lw = stack_column_linears([self.q_proj, self.k_proj, self.v_proj]) if fuse_qkv else None
        self.sinks = plain_param(f"{pre}.sinks", (self.num_heads,), torch.float32, device, (0, par.tp_rank, tp))

    def forward(self, ops: Ops, x: torch.Tensor, x_scale: torch.Tensor | None, fb: ForwardBatch,
                rope: RopeTables) -> torch.Tensor:
        """x: normalized hidden ``[T, H]`` (or its FP8 quantization with ``x_scale``) -> ``[T, H]``."""
        T = x.shape[0]
        Hq, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_lw is not None:
            qkv = ops.linear(x, self.qkv_lw, x_scale)                                   # [T, (Hq + 2 Hkv) D]
            q = qkv[:, :Hq * D].view(T, Hq, D)                                         # row-strided views
            k = qkv[:, Hq * D:(Hq + Hkv) * D].view(T, Hkv, D)
            v = qkv[:, (Hq + Hkv) * D:].view(T, Hkv, D)
        else:
            q = ops.linear(x, self.q_proj.lw, x_scale).view(T, Hq, D)
            k = ops.linear(x, self.k_proj.lw, x_scale).view(T, Hkv, D)
            v = ops.linear(x, self.v_proj.lw, x_scale).view(T, Hkv, D)
        q, k = ops.rope(q, k, rope.cos, rope.sin, fb.positions)
        k_cache, v_cache = fb.kv_caches[self.layer]
        sliding = self.window > 0
        tables = fb.block_tables_sliding if sliding else fb.block_tables_full
        o = ops.attention(q, k, v, k_cache, v_cache, tables, fb.cu_seqlens_q, fb.cached_lens, self.sinks,
                          self.scale, self.window, **fb.attention_hints())           # [T, Hq, D]
        ops.store_kv(k, v, k_cache, v_cache, fb.slots_sliding if sliding else fb.slots_full)
        y = ops.linear(o.reshape(T, -1), self.o_proj.lw)                            # [T, H] (partial under TP)
        return self.par.reduce(y) if self.par.tp_size > 1 else y
