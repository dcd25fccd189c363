"""Process bodies for the transfer tests (run under multiprocessing spawn: real separate processes)."""

from __future__ import annotations

import asyncio
import time

import torch

from dayzero.rpc.v1 import transfer_pb2
from dayzero.transfer import KVCompat, KVMemory, KVPool, TransferPlan, make_receiver, make_sender

NUM_LAYERS = 3
KV_HEADS, HEAD_DIM = 2, 8


def compat(block_size: int) -> KVCompat:
    return KVCompat(model_id="test-model", dtype="bfloat16", block_size=block_size, num_layers=NUM_LAYERS,
                    num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, sliding_window=128)


def make_memory(block_size: int, num_blocks: int, seed: int | None) -> KVMemory:
    """Pools [num_blocks, BS, Hkv, D] bf16 per layer and kind: random from `seed`, else zeros."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    pools = []
    for layer in range(NUM_LAYERS):
        for kind in ("k", "v"):
            shape = (num_blocks, block_size, KV_HEADS, HEAD_DIM)
            t = torch.randn(shape, generator=gen).to(torch.bfloat16) if gen is not None else torch.zeros(shape, dtype=torch.bfloat16)
            pools.append(KVPool(layer, kind, t))
    return KVMemory(compat(block_size), pools)


def receiver_main(kind: str, block_size: int, num_blocks: int, port: int, to_parent, from_parent,
                  leases: list[tuple[str, str]]) -> None:
    """Expose zeroed pools to senders of ``leases`` ((request_id, lease_id) expected), wait for the
    landed notification, send back the written blocks' bytes."""
    mem = make_memory(block_size, num_blocks, seed=None)

    async def serve():
        server = None
        rx = make_receiver(kind, mem, endpoint=f"127.0.0.1:{port}")
        for request_id, lease_id in leases:
            rx.expect(request_id, lease_id)
        if kind == "grpc":
            import grpc
            from dayzero.rpc.v1 import transfer_pb2_grpc
            server = grpc.aio.server()
            transfer_pb2_grpc.add_KVTransferServicer_to_server(rx.servicer(), server)
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
        to_parent.put(rx.info().SerializeToString())
        import queue
        deadline = time.monotonic() + 60
        landed: list[tuple[str, str]] = []
        dst = None
        while dst is None and time.monotonic() < deadline:  # until the parent asks for the blocks
            landed += rx.poll_landed()
            try:
                dst = from_parent.get_nowait()  # ([layer] -> dst blocks to read back, wait for landed?)
            except queue.Empty:
                await asyncio.sleep(0.002)
        dst, expect_landed = dst
        while expect_landed and not landed and time.monotonic() < deadline:
            landed += rx.poll_landed()
            await asyncio.sleep(0.002)
        landed += rx.poll_landed()
        # raw int16 numpy copies: torch tensors would travel as shared memory owned by this process
        blocks = {(p.layer, p.kind): p.tensor[dst[p.layer]].view(torch.int16).numpy().copy() for p in mem.pools}
        to_parent.put((landed, blocks))
        rx.close()
        if server is not None:
            await server.stop(None)

    asyncio.run(serve())


def sender_main(kind: str, num_blocks: int, info_bytes: bytes, jobs: list[tuple[int, int, TransferPlan]],
                to_parent) -> None:
    """For each (block_size, seed, plan): write the plan's blocks from seeded random pools of that
    block size; report ("ok", bytes, transport) or ("error", type name, message) per job."""
    info = transfer_pb2.KVReceiverInfo.FromString(info_bytes)
    results = []
    for block_size, seed, plan in jobs:
        tx = make_sender(kind, make_memory(block_size, num_blocks, seed=seed))
        try:
            res = tx.send(info, plan, timeout=30)
            results.append(("ok", res.bytes, res.transport))
        except Exception as e:  # noqa: BLE001 - the parent asserts on the type name and message
            results.append(("error", type(e).__name__, str(e)))
        finally:
            tx.close()
    to_parent.put(results)
