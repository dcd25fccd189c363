"""KV transfer base: the local KV memory description, a transfer plan, and sender/receiver ABCs.

Model of the memory: every (layer, kind in {"k","v"}) pool is one contiguous tensor of
``num_blocks`` blocks, each block one contiguous byte range of ``block_bytes`` bytes
([num_blocks, BS, Hkv, D] per pool). A plan lists, per layer, pairs (src block on the sender,
dst block on the receiver); the same pairs apply to that layer's K and V pools. Sliding-window
layers list only their ring blocks, so only the last window's tokens travel.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import torch

from dayzero.rpc.v1 import transfer_pb2

from .handshake import KVCompat


@dataclass
class KVPool:
    """One registered pool: a contiguous tensor whose first dim indexes blocks."""

    layer: int
    kind: str              # "k" | "v"
    tensor: torch.Tensor   # [num_blocks, ...] contiguous

    def __post_init__(self) -> None:
        if not self.tensor.is_contiguous():
            raise ValueError(f"KV pool layer {self.layer} {self.kind} is not contiguous")

    @property
    def num_blocks(self) -> int:
        return self.tensor.shape[0]

    @property
    def block_bytes(self) -> int:
        return self.tensor[0].numel() * self.tensor.element_size()

    @property
    def base_address(self) -> int:
        return self.tensor.data_ptr()

    @property
    def device_id(self) -> int:
        return max(self.tensor.get_device(), 0)

    @property
    def memory_type(self) -> str:
        return "VRAM" if self.tensor.is_cuda else "DRAM"

    def block_view(self, block: int) -> torch.Tensor:
        """The raw bytes of one block: uint8 [block_bytes]."""
        return self.tensor[block].view(-1).view(torch.uint8)

    def to_proto(self) -> transfer_pb2.KVRegion:
        return transfer_pb2.KVRegion(layer=self.layer, kind=self.kind, base_address=self.base_address,
                                     block_bytes=self.block_bytes, num_blocks=self.num_blocks,
                                     device_id=self.device_id)


@dataclass
class KVMemory:
    """The KV pools of one worker plus what they mean (the handshake)."""

    compat: KVCompat
    pools: list[KVPool]

    def __post_init__(self) -> None:
        kinds = {(p.layer, p.kind) for p in self.pools}
        if len(kinds) != len(self.pools):
            raise ValueError("duplicate (layer, kind) pools")
        for layer in range(self.compat.num_layers):
            for kind in ("k", "v"):
                if (layer, kind) not in kinds:
                    raise ValueError(f"KV memory lacks the {kind} pool of layer {layer}")

    @property
    def memory_type(self) -> str:
        return self.pools[0].memory_type

    def pool(self, layer: int, kind: str) -> KVPool:
        for p in self.pools:
            if p.layer == layer and p.kind == kind:
                return p
        raise KeyError((layer, kind))

    def total_bytes(self) -> int:
        return sum(p.num_blocks * p.block_bytes for p in self.pools)


@dataclass
class TransferPlan:
    """Which blocks of one request travel: per layer, (src block, dst block) pairs."""

    request_id: str
    lease_id: str
    pairs: list[list[tuple[int, int]]] = field(default_factory=list)  # [layer] -> [(src, dst)]

    @classmethod
    def from_blocks(cls, request_id: str, lease_id: str, src: list[list[int]], dst: list[list[int]]) -> "TransferPlan":
        if len(src) != len(dst):
            raise ValueError(f"plan for {request_id}: {len(src)} source layers vs {len(dst)} destination layers")
        pairs = []
        for layer, (s, d) in enumerate(zip(src, dst)):
            if len(s) > len(d):
                raise ValueError(f"plan for {request_id}: layer {layer} has {len(s)} source blocks but "
                                 f"only {len(d)} destination blocks")
            pairs.append(list(zip(s, d)))
        return cls(request_id, lease_id, pairs)

    def num_blocks(self) -> int:
        return sum(len(p) for p in self.pairs)


@dataclass
class TransferResult:
    bytes: int
    seconds: float
    transport: str


def landed_tag(request_id: str, lease_id: str) -> bytes:
    """The notification that tells the receiver a request's KV is complete."""
    return f"dz-kv-landed:{request_id}:{lease_id}".encode()


def stopped_tag(request_id: str, lease_id: str) -> bytes:
    """The notification that tells the receiver a sender gave up on a lease and writes nothing more."""
    return f"dz-kv-stopped:{request_id}:{lease_id}".encode()


def parse_tag(msg: bytes) -> tuple[str, str, str] | None:
    """(kind, request_id, lease_id) of a landed/stopped notification (kind "landed" | "stopped")."""
    try:
        text = msg.decode()
    except UnicodeDecodeError:
        return None
    for kind in ("landed", "stopped"):
        prefix = f"dz-kv-{kind}:"
        if text.startswith(prefix):
            request_id, _, lease_id = text[len(prefix):].rpartition(":")
            return kind, request_id, lease_id
    return None


def parse_landed_tag(msg: bytes) -> tuple[str, str] | None:
    tag = parse_tag(msg)
    return tag[1:] if tag is not None and tag[0] == "landed" else None


class KVSender(abc.ABC):
    """Writes a request's KV blocks from local memory into a receiver's blocks.

    ``send`` checks the handshake first (``IncompatiblePeer`` on a mismatch), writes every block
    of the plan, then tells the receiver the request's KV has landed; it raises ``TransferError``
    on failure or when ``timeout`` seconds pass.
    """

    name: str = "base"
    overlaps: bool = False   # True: post() returns before the bytes move (compute can go on meanwhile)

    def __init__(self, memory: KVMemory):
        self.memory = memory

    @abc.abstractmethod
    def send(self, receiver: transfer_pb2.KVReceiverInfo, plan: TransferPlan, timeout: float = 30.0) -> TransferResult:
        ...

    def post(self, receiver: transfer_pb2.KVReceiverInfo, plan: TransferPlan, notify: bool = True):
        """Start writing ``plan``; ``wait(posted)`` finishes it. Only senders with ``overlaps``
        implement this (the prefill worker then writes finished blocks while later chunks compute)."""
        raise NotImplementedError(f"the {self.name} transport writes synchronously; use send()")

    def wait(self, posted, timeout: float = 30.0) -> TransferResult:
        raise NotImplementedError(f"the {self.name} transport writes synchronously; use send()")

    def stopped(self, receiver: transfer_pb2.KVReceiverInfo, request_id: str, lease_id: str) -> None:
        """Tell the receiver this sender writes nothing more into the lease (it failed or was
        cancelled, after its writes ended). Best effort, never raises. Senders whose writes the
        receiver performs itself (``KVReceiver.remote_writes`` False) need not say it."""

    def close(self) -> None:
        pass


class KVReceiver(abc.ABC):
    """Exposes local KV memory to senders and reports which requests' KV has landed.

    ``info()`` is sent out of band to the sender (the Allocate reply). ``poll_landed()`` returns
    the (request_id, lease_id) pairs completed since the last call; it never blocks long.

    Leases: the owner calls ``expect`` before handing a lease to a sender and ``forget`` when it is
    over. With ``remote_writes`` False the receiver performs every write itself and refuses those
    of a lease it does not expect, so after ``forget`` the blocks may be reused at once. With
    ``remote_writes`` True (one-sided RDMA) a sender may still be writing a forgotten lease: the
    owner must keep its blocks until the sender's landed or stopped notification
    (``poll_stopped``) or a timeout.
    """

    name: str = "base"
    remote_writes: bool = False

    def __init__(self, memory: KVMemory):
        self.memory = memory

    @abc.abstractmethod
    def info(self) -> transfer_pb2.KVReceiverInfo:
        ...

    @abc.abstractmethod
    def poll_landed(self) -> list[tuple[str, str]]:
        ...

    def poll_stopped(self) -> list[tuple[str, str]]:
        """(request_id, lease_id) of leases whose sender said it stopped without landing them."""
        return []

    def expect(self, request_id: str, lease_id: str) -> None:
        """A sender will write this lease soon (a receiver may poll harder until ``forget``)."""

    def forget(self, request_id: str, lease_id: str) -> None:
        """The lease is no longer expected (landed, released or expired)."""

    def close(self) -> None:
        pass
