"""Decode CUDA-graph inputs on the CPU: the static metadata a graph reads (written incrementally, step
after step, with rows changing owners) equals what the eager model runner builds from the KV
manager; dummy rows store nothing; graphs stay off on CPU and for the torch backend."""

from __future__ import annotations

import math
import random

import pytest
import torch

from dayzero.config import preset
from dayzero.kvcache import KVCacheManager, KVCacheSpec
from dayzero.runtime.cuda_graph import CACHED, IDS, POS, SLOT_FULL, SLOT_SLIDING, DecodeInputs
from dayzero.runtime.model_runner import ModelRunner, SeqChunk

CFG = preset("tiny2")  # sliding, full, sliding; window 128


def _check(inp: DecodeInputs, kv: KVCacheManager, chunks: list[SeqChunk], bucket: int) -> None:
    B = len(chunks)
    ids = [c.seq_id for c in chunks]
    starts = [c.start for c in chunks]
    full, slide = kv.block_tables(ids, [s + 1 for s in starts], "cpu")
    slots_full, slots_slide = kv.slot_mappings(ids, starts, [1] * B, "cpu")
    meta, tables = inp.meta, inp.tables
    assert meta[IDS, :B].tolist() == [c.token_ids[0] for c in chunks]
    assert meta[POS, :B].tolist() == starts and meta[CACHED, :B].tolist() == starts
    assert meta[SLOT_FULL, :B].tolist() == slots_full.tolist()
    assert meta[SLOT_SLIDING, :B].tolist() == slots_slide.tolist()
    for b, s in enumerate(starts):
        nblk = s // kv.BS + 1
        assert tables[0, b, :nblk].tolist() == full[b, :nblk].tolist()
        first = max(0, nblk - kv.R)  # older logical blocks are outside the window: never read
        assert tables[1, b, first:nblk].tolist() == slide[b, first:nblk].tolist()
    # dummy rows: no cached tokens, position 0, nothing stored
    assert (meta[CACHED, B:bucket] == 0).all() and (meta[POS, B:bucket] == 0).all()
    assert (meta[SLOT_FULL:, B:bucket] == -1).all()


@pytest.mark.parametrize("bs", [8, 16])
def test_inputs_match_eager_metadata_over_steps(bs):
    spec = KVCacheSpec.from_model(CFG, bs, torch.float32)
    kv = KVCacheManager(spec, num_blocks=512, max_seqs=16)
    rng = random.Random(bs)
    inp = DecodeInputs(kv, max_batch=8, max_len=1024, device=torch.device("cpu"))
    lens = {f"s{i}": rng.choice([0, 1, bs - 1, bs, 130, 300]) for i in range(6)}
    for sid, n in lens.items():
        kv.ensure(sid, n + 40)
    order = list(lens)
    for step in range(30):
        if step == 10:  # rows change owners: shuffle, drop one, add a new sequence
            rng.shuffle(order)
            kv.free(order.pop())
            kv.ensure("new", 200)
            lens["new"] = 150
            order.insert(1, "new")
        if step == 20:  # a freed id comes back with other blocks
            sid = order[0]
            kv.free(sid)
            kv.ensure("filler", 64)
            kv.ensure(sid, 100)
            lens[sid] = 50
        chunks = [SeqChunk(s, [rng.randrange(CFG.vocab_size)], lens[s]) for s in order]
        bucket = 1 << math.ceil(math.log2(len(chunks)))
        inp.fill(chunks, bucket)
        _check(inp, kv, chunks, bucket)
        for s in order:
            lens[s] += 1


def test_inputs_refuse_bad_batches():
    spec = KVCacheSpec.from_model(CFG, 16, torch.float32)
    kv = KVCacheManager(spec, num_blocks=64, max_seqs=4)
    kv.ensure("a", 20)
    inp = DecodeInputs(kv, max_batch=2, max_len=64, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="bucket"):
        inp.fill([SeqChunk("a", [1], 3)] * 3, 4)
    with pytest.raises(RuntimeError, match="reserved"):
        inp.fill([SeqChunk("a", [1], 20)], 1)
    with pytest.raises(RuntimeError, match="reserved"):
        inp.fill([SeqChunk("unknown", [1], 0)], 1)


def test_graphs_off_on_cpu(make_ckpt):
    from dayzero.runtime.engine import Engine, EngineConfig

    eng = Engine.from_dir(make_ckpt("tiny2"), dtype="float32", backend="torch", device="cpu",
                          config=EngineConfig(max_num_seqs=4, max_model_len=256))
    assert eng.runner.graphs is None and not eng.runner.attention_hints
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        ModelRunner(eng.model, eng.kv, cuda_graphs=True)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        Engine(eng.model, EngineConfig(max_num_seqs=4, max_model_len=256, cuda_graphs=True))
