"""Transfer handshake: a protocol version plus a compatibility hash over what gives KV bytes meaning.

Two workers may hand KV blocks to each other only if they agree on the model, the KV dtype, the
block size, the KV layout, TP, and the attention geometry. Each side describes itself with a
``KVCompat``; ``check_compatible`` refuses a mismatch with a message naming every differing field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from dayzero.rpc.v1 import transfer_pb2

TRANSFER_PROTOCOL_VERSION = 1

# layout of every pool: [num_blocks, block_size, kv_heads, head_dim]; sliding layers hold a
# per-sequence ring of blocks (only the last `sliding_window` tokens travel)
DEFAULT_KV_LAYOUT = "NB,BS,Hkv,D;sliding-ring"


class TransferError(RuntimeError):
    """A KV transfer failed (peer gone, timed out, bad descriptor)."""


class IncompatiblePeer(TransferError):
    """The peer's KV cache is laid out differently; ``fields`` names what differs."""

    def __init__(self, message: str, fields: list[str]):
        super().__init__(message)
        self.fields = fields


@dataclass(frozen=True)
class KVCompat:
    """Everything that must match between a KV sender and receiver."""

    model_id: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int
    tp_size: int = 1
    kv_layout: str = DEFAULT_KV_LAYOUT
    version: int = TRANSFER_PROTOCOL_VERSION

    def hash(self) -> str:
        fields = dataclasses.asdict(self)
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:32]

    def to_proto(self) -> transfer_pb2.KVCompat:
        return transfer_pb2.KVCompat(
            version=self.version, hash=self.hash(), model_id=self.model_id, dtype=self.dtype,
            block_size=self.block_size, kv_layout=self.kv_layout, tp_size=self.tp_size,
            num_layers=self.num_layers, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            sliding_window=self.sliding_window)

    @classmethod
    def from_proto(cls, p: transfer_pb2.KVCompat) -> "KVCompat":
        return cls(model_id=p.model_id, dtype=p.dtype, block_size=p.block_size, num_layers=p.num_layers,
                   num_kv_heads=p.num_kv_heads, head_dim=p.head_dim, sliding_window=p.sliding_window,
                   tp_size=p.tp_size, kv_layout=p.kv_layout, version=p.version)


def mismatched_fields(local: KVCompat, peer: KVCompat) -> list[tuple[str, object, object]]:
    """(field, local value, peer value) for every field that differs."""
    out = []
    for f in dataclasses.fields(KVCompat):
        a, b = getattr(local, f.name), getattr(peer, f.name)
        if a != b:
            out.append((f.name, a, b))
    return out


def check_compatible(local: KVCompat, peer: KVCompat | transfer_pb2.KVCompat, peer_name: str = "peer") -> None:
    """Raise ``IncompatiblePeer`` naming every mismatched field; return None when they agree.

    A proto whose ``hash`` does not match its own fields (corrupted or from a different hashing
    rule) is refused too.
    """
    if isinstance(peer, transfer_pb2.KVCompat):
        claimed = peer.hash
        peer = KVCompat.from_proto(peer)
        if claimed and claimed != peer.hash() and peer.version == local.version:
            raise IncompatiblePeer(f"KV transfer refused: {peer_name}'s compatibility hash {claimed} does not "
                                   f"match its own fields (expected {peer.hash()})", ["hash"])
    diffs = mismatched_fields(local, peer)
    if not diffs:
        return
    detail = "; ".join(f"{name}: ours {a!r}, {peer_name} {b!r}" for name, a, b in diffs)
    raise IncompatiblePeer(f"KV transfer refused: incompatible {peer_name} ({detail})", [d[0] for d in diffs])
