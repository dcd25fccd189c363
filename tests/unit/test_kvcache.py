"""Paged KV cache: allocator accounting, sliding-window rings, slot mappings, transfer views, and no
leaks through the engine (finish, abort, preemption, a cache too small to grow)."""

from __future__ import annotations

import math

import pytest
import torch

from dayzero.config import preset
from dayzero.kvcache import BlockAllocator, KVCacheFullError, KVCacheManager, KVCacheSpec
from dayzero.runtime.engine import Engine, EngineConfig
from dayzero.runtime.sampling import SamplingParams
from dayzero.weights.loader import load_model

CFG = preset("tiny2")  # layers: sliding, full, sliding; window 128


def test_allocator_accounting_and_errors():
    a = BlockAllocator(8, "test")
    x = a.allocate(5)
    assert (a.num_free, a.num_used) == (3, 5) and len(set(x)) == 5
    with pytest.raises(KVCacheFullError, match="need 4 block"):
        a.allocate(4)
    assert a.num_free == 3  # a refused allocation takes nothing
    a.free(x[:2])
    with pytest.raises(ValueError, match="double free"):
        a.free(x[:1])
    a.free(x[2:])
    assert (a.num_free, a.num_used) == (8, 0)


def test_block_size_must_be_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        KVCacheSpec.from_model(CFG, block_size=24)


@pytest.mark.parametrize("bs", [8, 16, 64])
def test_rings_and_slot_mappings(bs):
    spec = KVCacheSpec.from_model(CFG, bs, torch.float32)
    R = spec.ring_blocks
    assert R == math.ceil(CFG.sliding_window / bs) + 1
    kv = KVCacheManager(spec, num_blocks=128, max_seqs=2)
    n = 5 * CFG.sliding_window + 3
    seq = kv.ensure("a", n)
    assert len(seq.full) == math.ceil(n / bs) and len(seq.ring) == R
    full, slide = kv.block_tables(["a"], [n], "cpu")
    nblk = math.ceil(n / bs)
    assert full[0, :nblk].tolist() == seq.full[:nblk]
    assert slide[0, :nblk].tolist() == [seq.ring[j % R] for j in range(nblk)]
    # a chunk ending at n: full layers store every token; sliding layers only the last window
    start = n - 300
    s_full, s_slide = kv.slot_mappings(["a"], [start], [300], "cpu")
    pos = torch.arange(start, n)
    assert s_full.tolist() == [seq.full[p // bs] * bs + p % bs for p in pos.tolist()]
    kept = s_slide >= 0
    assert pos[kept].tolist() == list(range(n - CFG.sliding_window, n))
    assert len(set(s_slide[kept].tolist())) == CFG.sliding_window  # no two kept tokens share a slot
    # growing past what was reserved is refused
    with pytest.raises(RuntimeError, match="exceed"):
        kv.slot_mappings(["a"], [n], [1], "cpu")
    kv.free("a")
    assert kv.num_used_blocks == 0


def test_transfer_views_address_the_real_bytes():
    spec = KVCacheSpec.from_model(CFG, 16, torch.bfloat16)
    kv = KVCacheManager(spec, num_blocks=32, max_seqs=2)
    kv.ensure("x", 7)           # someone else's blocks first, so ids are not trivially 0..n
    n = 200
    kv.ensure("a", n)
    addrs = kv.block_addresses("a", n)
    nblk = math.ceil(n / 16)
    first_ring = (n - CFG.sliding_window) // 16
    for layer in range(CFG.num_hidden_layers):
        want = nblk if layer in spec.full_layers else nblk - first_ring
        for kind in ("k", "v"):
            mine = [a for a in addrs if a.layer == layer and a.kind == kind]
            assert len(mine) == want
    # each address is the start of that block's bytes in the pool tensor
    for a in addrs[:: max(1, len(addrs) // 20)]:
        k, v = kv.layer_cache(a.layer)
        t = (k if a.kind == "k" else v)[a.block]
        assert t.is_contiguous() and t.data_ptr() == a.addr
        assert t.numel() * t.element_size() == a.nbytes == spec.block_nbytes
    regions = kv.regions()
    assert sum(r.nbytes for r in regions) == sum(p.data.numel() * p.data.element_size()
                                                  for p in (kv.full_pool, kv.ring_pool))
    for a in addrs:
        r = next(r for r in regions if r.pool == ("sliding" if a.key[0] == "ring" else "full"))
        assert r.data_ptr <= a.addr and a.addr + a.nbytes <= r.data_ptr + r.nbytes
    per_layer = kv.layer_blocks("a", n)
    assert [len(b) for b in per_layer] == [len([a for a in addrs if a.layer == i and a.kind == "k"])
                                           for i in range(CFG.num_hidden_layers)]


def test_cache_full_is_all_or_nothing():
    kv = KVCacheManager(KVCacheSpec.from_model(CFG, 16, torch.float32), num_blocks=10, max_seqs=1)
    kv.ensure("a", 100)                    # 7 full blocks, ring of 7
    with pytest.raises(KVCacheFullError, match="KV cache full"):
        kv.ensure("b", 100)
    assert not kv.has("b")
    assert kv.full_alloc.num_used == 7 and kv.ring_alloc.num_used == 7
    kv.free("a")
    assert kv.num_used_blocks == 0


@pytest.fixture(scope="module")
def model(make_ckpt):
    return load_model(make_ckpt("tiny2"), dtype="float32", max_positions=1024)


def _prompts(n, lens, seed=9):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CFG.vocab_size, (k,), generator=g).tolist() for k in lens[:n]]


def test_no_leaks_after_finish_and_abort(model):
    eng = Engine(model, EngineConfig(num_kv_blocks=64, max_num_batched_tokens=64))
    ps = _prompts(4, [50, 130, 7, 90])
    for i, p in enumerate(ps):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=20, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert eng.kv.num_used_blocks > 0
    assert eng.abort("r1") and eng.abort("r3")
    assert not eng.abort("r1")  # unknown now
    while eng.has_unfinished():
        for o in eng.step():
            assert o.request_id in ("r0", "r2")
    assert eng.kv.num_used_blocks == 0 and eng.kv.full_alloc.num_free == 64
    # leases: allocate then free, and allocate then abort
    eng.allocate("L1", 100)
    eng.allocate("L2", 40)
    with pytest.raises(ValueError, match="already in use"):
        eng.allocate("L1", 10)
    assert eng.free("L1") and eng.abort("L2")
    assert eng.kv.num_used_blocks == 0


def test_preemption_keeps_greedy_tokens_and_frees_everything(model):
    ps = _prompts(3, [60, 100, 40], seed=10)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    roomy = Engine(model, EngineConfig(num_kv_blocks=64)).generate(ps, params)
    # 20 blocks of 16 tokens cannot hold all three (~ 26 blocks at the end): requests get preempted
    tight = Engine(model, EngineConfig(num_kv_blocks=20, max_num_batched_tokens=64))
    assert tight.generate(ps, params) == roomy
    assert tight.scheduler.num_preemptions > 0
    assert tight.kv.num_used_blocks == 0


def test_request_that_cannot_grow_ends_with_length(model):
    eng = Engine(model, EngineConfig(num_kv_blocks=4))  # 64 tokens in all
    eng.add_request("a", list(range(1, 50)), SamplingParams(max_tokens=100, ignore_eos=True))
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert len([o for o in outs if o.token_id >= 0]) == 64 - 49 + 1  # fills the cache, then one more token
    assert eng.kv.num_used_blocks == 0
    with pytest.raises(ValueError, match="needs 5 KV blocks"):
        eng.add_request("b", list(range(1, 70)))
