"""KV transfer between two real processes: NIXL (UCX, host memory) and the gRPC byte-stream fallback.

Per transport one receiver process (block size 16) and one sender process: the sender first
writes random blocks from block-size-16 pools (must arrive byte for byte), then tries again from
block-size-32 pools (must be refused, naming block_size, with nothing written or announced).
"""

from __future__ import annotations

import multiprocessing as mp
import random

import pytest
import torch

import transfer_peers as peers
from dayzero.serving.launch import free_port
from dayzero.transfer import IncompatiblePeer, KVCompat, TransferPlan, check_compatible

NUM_BLOCKS, BS, SEED = 32, 16, 7


def _random_plan(rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
    """Per layer distinct src and dst blocks; layer lengths differ (a sliding layer sends fewer)."""
    src, dst = [], []
    for layer in range(peers.NUM_LAYERS):
        n = rng.randint(1, 9) if layer % 2 == 0 else rng.randint(10, 20)
        src.append(rng.sample(range(NUM_BLOCKS), n))
        dst.append(rng.sample(range(NUM_BLOCKS - 2), n))  # the last two blocks stay for the refused senders
    return src, dst


@pytest.fixture(scope="module", params=["nixl", "grpc"])
def exchange(request):
    """Run the receiver and the sender; return (kind, src, dst, sender results, landed, blocks read back)."""
    kind = request.param
    src, dst = _random_plan(random.Random(1234))
    good = TransferPlan.from_blocks("req-1", "lease-1", src, dst)
    unused = [[NUM_BLOCKS - 1, NUM_BLOCKS - 2]] * peers.NUM_LAYERS
    bad = TransferPlan.from_blocks("req-2", "lease-2", [[0]] * peers.NUM_LAYERS, [[NUM_BLOCKS - 1]] * peers.NUM_LAYERS)
    # a lease the receiver never expected (or already forgot): the grpc receiver refuses it; NIXL
    # writes are one-sided, so there the decode worker holds such blocks back instead (e2e tests)
    stray = TransferPlan.from_blocks("req-3", "lease-3", [[1]] * peers.NUM_LAYERS, [[NUM_BLOCKS - 2]] * peers.NUM_LAYERS)
    jobs = [(BS, SEED, good), (2 * BS, SEED, bad)] + ([(BS, SEED, stray)] if kind == "grpc" else [])
    ctx = mp.get_context("spawn")
    to_parent, from_parent, tx_out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    rx = ctx.Process(target=peers.receiver_main,
                     args=(kind, BS, NUM_BLOCKS, free_port(), to_parent, from_parent,
                           [(good.request_id, good.lease_id), (bad.request_id, bad.lease_id)]), daemon=True)
    rx.start()
    try:
        info = to_parent.get(timeout=90)
        tx = ctx.Process(target=peers.sender_main,
                         args=(kind, NUM_BLOCKS, info, jobs, tx_out), daemon=True)
        tx.start()
        results = tx_out.get(timeout=90)
        tx.join(30)
        from_parent.put(([d + u for d, u in zip(dst, unused)], results[0][0] == "ok"))
        landed, blocks = to_parent.get(timeout=90)
        rx.join(30)
    finally:
        if rx.is_alive():
            rx.kill()
    return kind, src, dst, results, landed, blocks


def test_random_blocks_arrive_intact(exchange):
    kind, src, dst, results, landed, blocks = exchange
    status, nbytes, transport = results[0]
    assert status == "ok", results[0]
    assert transport == kind
    assert ("req-1", "lease-1") in landed
    sent = peers.make_memory(BS, NUM_BLOCKS, seed=SEED)  # the sender's pools, rebuilt from its seed
    expected_bytes = 0
    for pool in sent.pools:
        n = len(src[pool.layer])
        want = pool.tensor[src[pool.layer]]
        got = torch.from_numpy(blocks[(pool.layer, pool.kind)][:n])
        assert torch.equal(got, want.view(torch.int16)), (pool.layer, pool.kind)
        expected_bytes += want.numel() * want.element_size()
    assert nbytes == expected_bytes


def test_mismatched_block_size_is_refused_naming_the_field(exchange):
    kind, src, dst, results, landed, blocks = exchange
    status, err_type, message = results[1]
    assert status == "error" and err_type == "IncompatiblePeer", results[1]
    assert "block_size" in message and "16" in message and "32" in message
    assert ("req-2", "lease-2") not in landed  # nothing was announced ...
    for (layer, kind_), arr in blocks.items():  # ... or written into the block reserved for it
        assert not arr[len(dst[layer]):].any(), (layer, kind_)


def test_handshake_names_every_mismatched_field():
    a = peers.compat(16)
    b = KVCompat(model_id="other", dtype="float8_e4m3fn", block_size=16, num_layers=peers.NUM_LAYERS,
                 num_kv_heads=peers.KV_HEADS, head_dim=peers.HEAD_DIM, sliding_window=128, tp_size=2)
    with pytest.raises(IncompatiblePeer) as e:
        check_compatible(a, b.to_proto())
    assert set(e.value.fields) == {"model_id", "dtype", "tp_size"}
    for name in ("model_id", "dtype", "tp_size"):
        assert name in str(e.value)
    check_compatible(a, peers.compat(16).to_proto())  # equal: no error
    tampered = a.to_proto()
    tampered.hash = "0" * 32
    with pytest.raises(IncompatiblePeer, match="hash"):
        check_compatible(a, tampered)
    assert a.hash() != b.hash()


def test_plan_with_too_few_destination_blocks_is_rejected():
    with pytest.raises(ValueError, match="layer 0"):
        TransferPlan.from_blocks("r", "l", [[1, 2]], [[3]])


def test_grpc_receiver_refuses_a_lease_it_does_not_expect(exchange):
    kind, src, dst, results, landed, blocks = exchange
    if kind != "grpc":
        pytest.skip("NIXL writes are one-sided: the receiver cannot refuse them")
    status, err_type, message = results[2]
    assert status == "error" and "not open" in message, results[2]
    assert ("req-3", "lease-3") not in landed
    for (layer, kind_), arr in blocks.items():  # the block it aimed at is still zero
        assert not arr[len(dst[layer]):].any(), (layer, kind_)
