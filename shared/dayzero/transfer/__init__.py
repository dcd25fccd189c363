"""KV-cache handoff between workers: base classes, handshake, NIXL and gRPC byte-stream transports.

Pick a transport explicitly with ``make_sender`` / ``make_receiver`` (``"nixl"`` or ``"grpc"``);
a NIXL that cannot load raises ``TransferError`` telling the user to choose ``grpc`` instead.
"""

from __future__ import annotations

from .base import KVMemory, KVPool, KVReceiver, KVSender, TransferPlan, TransferResult
from .handshake import (TRANSFER_PROTOCOL_VERSION, IncompatiblePeer, KVCompat, TransferError,
                        check_compatible)

TRANSPORTS = ("nixl", "grpc")

__all__ = ["KVMemory", "KVPool", "KVReceiver", "KVSender", "TransferPlan", "TransferResult", "KVCompat",
           "TransferError", "IncompatiblePeer", "check_compatible", "TRANSFER_PROTOCOL_VERSION", "TRANSPORTS",
           "make_sender", "make_receiver"]


def _check_kind(kind: str) -> None:
    if kind not in TRANSPORTS:
        raise ValueError(f"unknown KV transport {kind!r}; choose one of {', '.join(TRANSPORTS)}")


def make_sender(kind: str, memory: KVMemory) -> KVSender:
    _check_kind(kind)
    if kind == "nixl":
        from .nixl import NixlSender
        return NixlSender(memory)
    from .grpc_stream import GrpcStreamSender
    return GrpcStreamSender(memory)


def make_receiver(kind: str, memory: KVMemory, endpoint: str = "") -> KVReceiver:
    """``endpoint`` (host:port of the gRPC server that will serve KVTransfer) is needed for grpc."""
    _check_kind(kind)
    if kind == "nixl":
        from .nixl import NixlReceiver
        return NixlReceiver(memory)
    if not endpoint:
        raise ValueError("the grpc KV transport needs the receiver's advertised host:port")
    from .grpc_stream import GrpcStreamReceiver
    return GrpcStreamReceiver(memory, endpoint)
