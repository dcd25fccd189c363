"""The KV memory of a ``KVCacheManager`` as a transport sees it (pools + handshake)."""

from __future__ import annotations

from dayzero.kvcache import KVCacheManager

from .base import KVMemory, KVPool
from .handshake import KVCompat


def kv_compat(kv: KVCacheManager, model_id: str, tp_size: int = 1) -> KVCompat:
    spec = kv.spec
    # the layout itself; block size, dtype, window, heads are fields of their own
    layers = "".join("s" if t == "sliding_attention" else "f" for t in spec.layer_types)
    layout = f"[L,2,NB,BS,Hkv,D];sliding=ring(ceil(W/BS)+1);layers={layers}"
    return KVCompat(model_id=model_id, dtype=str(spec.dtype).removeprefix("torch."), block_size=spec.block_size,
                    num_layers=len(spec.layer_types), num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                    sliding_window=spec.window, tp_size=tp_size, kv_layout=layout)


def kv_memory(kv: KVCacheManager, model_id: str, tp_size: int = 1) -> KVMemory:
    """Every (layer, kind) pool view [NB, BS, Hkv, D] of the cache, with the handshake fields."""
    pools = [KVPool(layer, kind, t) for layer, kind, t in kv.layer_tensors()]
    return KVMemory(kv_compat(kv, model_id, tp_size), pools)
