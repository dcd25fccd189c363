"""gRPC byte-stream KV transport: the explicit fallback where NIXL cannot load.

The sender streams one ``KVChunk`` per (pool, block) to the receiver's ``KVTransfer.Push``; the
first message carries the handshake, the last one says the KV is complete. Slower than NIXL
(every byte goes through protobuf and the receiver copies it), never chosen silently.
"""

from __future__ import annotations

import collections
import threading
import time

import grpc
import torch

from dayzero.rpc.v1 import transfer_pb2, transfer_pb2_grpc

from .base import KVMemory, KVReceiver, KVSender, TransferPlan, TransferResult
from .handshake import IncompatiblePeer, TransferError, check_compatible

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class GrpcStreamSender(KVSender):
    name = "grpc"

    def __init__(self, memory: KVMemory):
        super().__init__(memory)
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def _stub(self, endpoint: str) -> transfer_pb2_grpc.KVTransferStub:
        with self._lock:
            ch = self._channels.get(endpoint)
            if ch is None:
                opts = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
                ch = self._channels[endpoint] = grpc.insecure_channel(endpoint, options=opts)
            return transfer_pb2_grpc.KVTransferStub(ch)

    def _chunks(self, receiver: transfer_pb2.KVReceiverInfo, plan: TransferPlan, counter: list[int]):
        yield transfer_pb2.KVChunk(request_id=plan.request_id, lease_id=plan.lease_id,
                                   compat=self.memory.compat.to_proto())
        for idx, region in enumerate(receiver.regions):
            pool = self.memory.pool(region.layer, region.kind)
            for src, dst in plan.pairs[region.layer]:
                data = pool.block_view(src).cpu().numpy().tobytes()
                counter[0] += len(data)
                yield transfer_pb2.KVChunk(request_id=plan.request_id, lease_id=plan.lease_id, region=idx,
                                           dst_block=dst, data=data)
        yield transfer_pb2.KVChunk(request_id=plan.request_id, lease_id=plan.lease_id, last=True)

    def send(self, receiver: transfer_pb2.KVReceiverInfo, plan: TransferPlan, timeout: float = 30.0) -> TransferResult:
        if receiver.transport != "grpc":
            raise TransferError(f"this worker sends KV over grpc but the receiver expects {receiver.transport!r}; "
                                "start both with the same --transport")
        check_compatible(self.memory.compat, receiver.compat, "decode worker")
        t0 = time.perf_counter()
        counter = [0]
        try:
            self._stub(receiver.endpoint).Push(self._chunks(receiver, plan, counter), timeout=timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise IncompatiblePeer(e.details(), []) from None
            raise TransferError(f"gRPC KV push to {receiver.endpoint} failed: {e.code().name}: {e.details()}") from None
        return TransferResult(bytes=counter[0], seconds=time.perf_counter() - t0, transport="grpc")

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()


class GrpcStreamReceiver(KVReceiver):
    """Receives pushed blocks into the local pools; add ``servicer()`` to an aio gRPC server.

    It writes every block itself and only into a lease it expects: a push for a lease that was
    never announced, or was forgotten (released, expired) meanwhile, is refused (NOT_FOUND), so
    the blocks of a forgotten lease can be reused at once."""

    name = "grpc"

    def __init__(self, memory: KVMemory, endpoint: str):
        super().__init__(memory)
        self.endpoint = endpoint
        self._landed: collections.deque[tuple[str, str]] = collections.deque()
        self._lock = threading.Lock()                  # orders writes against ``forget``
        self._open: set[tuple[str, str]] = set()       # (request_id, lease_id) a sender may write

    def expect(self, request_id: str, lease_id: str) -> None:
        with self._lock:
            self._open.add((request_id, lease_id))

    def forget(self, request_id: str, lease_id: str) -> None:
        with self._lock:  # waits for a block copy in progress: none follows
            self._open.discard((request_id, lease_id))

    def is_open(self, request_id: str, lease_id: str) -> bool:
        with self._lock:
            return (request_id, lease_id) in self._open

    def info(self) -> transfer_pb2.KVReceiverInfo:
        return transfer_pb2.KVReceiverInfo(transport="grpc", compat=self.memory.compat.to_proto(),
                                           endpoint=self.endpoint, memory_type=self.memory.memory_type,
                                           regions=[p.to_proto() for p in self.memory.pools])

    def poll_landed(self) -> list[tuple[str, str]]:
        out = []
        while self._landed:
            out.append(self._landed.popleft())
        return out

    def servicer(self) -> "KVTransferServicer":
        return KVTransferServicer(self)

    def write_block(self, region: int, dst_block: int, data: bytes, lease: tuple[str, str]) -> None:
        pools = self.memory.pools
        if not 0 <= region < len(pools):
            raise TransferError(f"region {region} out of range ({len(pools)} regions)")
        pool = pools[region]
        if not 0 <= dst_block < pool.num_blocks:
            raise TransferError(f"block {dst_block} out of range ({pool.num_blocks} blocks)")
        if len(data) != pool.block_bytes:
            raise TransferError(f"block of {len(data)} bytes, expected {pool.block_bytes}")
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        with self._lock:
            if lease not in self._open:
                raise LeaseClosed(f"lease {lease[1]} of {lease[0]} is not open on this worker (expired or released); "
                                  "nothing written")
            pool.block_view(dst_block).copy_(src)


class LeaseClosed(TransferError):
    """A push for a lease the receiver does not (or no longer) expect."""


class KVTransferServicer(transfer_pb2_grpc.KVTransferServicer):
    def __init__(self, receiver: GrpcStreamReceiver):
        self.receiver = receiver

    async def Push(self, request_iterator, context):
        first = True
        nbytes = blocks = 0
        async for chunk in request_iterator:
            if first:
                first = False
                try:
                    check_compatible(self.receiver.memory.compat, chunk.compat, "prefill worker")
                except IncompatiblePeer as e:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
                continue
            lease = (chunk.request_id, chunk.lease_id)
            if chunk.data:
                try:
                    self.receiver.write_block(chunk.region, chunk.dst_block, chunk.data, lease)
                except LeaseClosed as e:
                    await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
                except TransferError as e:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                nbytes += len(chunk.data)
                blocks += 1
            if chunk.last:
                if not self.receiver.is_open(*lease):
                    await context.abort(grpc.StatusCode.NOT_FOUND, f"lease {lease[1]} of {lease[0]} is not open on "
                                                                   "this worker (expired or released)")
                self.receiver._landed.append(lease)
                return transfer_pb2.KVPushReply(bytes=nbytes, blocks=blocks)
        await context.abort(grpc.StatusCode.DATA_LOSS, "KV stream ended before its last chunk")
