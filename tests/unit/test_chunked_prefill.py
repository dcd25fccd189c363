"""Chunked prefill gives the logits of one-shot prefill; a mixed batch decodes like each sequence alone."""

from __future__ import annotations

import pytest
import torch

from dayzero.kvcache import KVCacheManager, KVCacheSpec
from dayzero.runtime.engine import Engine, EngineConfig
from dayzero.runtime.model_runner import ModelRunner, SeqChunk
from dayzero.runtime.sampling import SamplingParams
from dayzero.weights.loader import load_model


@pytest.fixture(scope="module")
def tiny2_fp32(make_ckpt):
    d = make_ckpt("tiny2")
    return d, load_model(d, dtype="float32", max_positions=1024)


def _prefill(model, ids: list[int], chunk: int) -> torch.Tensor:
    kv = KVCacheManager(KVCacheSpec.from_model(model.cfg, 16, torch.float32), num_blocks=64, max_seqs=1)
    runner = ModelRunner(model, kv)
    kv.ensure("s", len(ids))
    return torch.cat([runner.run([SeqChunk("s", ids[s:s + chunk], s, "all")])[0] for s in range(0, len(ids), chunk)])


def test_chunked_prefill_matches_one_shot(tiny2_fp32):
    _, model = tiny2_fp32
    ids = torch.randint(0, model.cfg.vocab_size, (300,), generator=torch.Generator().manual_seed(5)).tolist()
    one_shot = _prefill(model, ids, len(ids))
    assert one_shot.std() > 0.5
    for chunk in (5, 64, 129, 200):  # 129 > window: a chunk spans a whole sliding window
        err = float((_prefill(model, ids, chunk) - one_shot).abs().max() / one_shot.abs().max())
        print(f"chunk {chunk}: max rel diff vs one-shot {err:.2e}")
        assert err < 1e-5, chunk


def test_engine_chunk_budget_does_not_change_tokens(tiny2_fp32):
    d, model = tiny2_fp32
    ids = torch.randint(0, model.cfg.vocab_size, (260,), generator=torch.Generator().manual_seed(6)).tolist()
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    outs = [Engine(model, EngineConfig(max_num_batched_tokens=b, num_kv_blocks=64)).generate([ids], params)[0]
            for b in (17, 128, 4096)]
    assert outs[0] == outs[1] == outs[2]


def test_mixed_batch_decodes_like_each_alone(tiny2_fp32):
    _, model = tiny2_fp32
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,), generator=g).tolist() for n in (1, 9, 140, 33, 257)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [Engine(model, EngineConfig(num_kv_blocks=64)).generate([p], params)[0] for p in prompts]
    # together, with a budget that mixes prefill chunks and decodes in the same forward passes,
    # and with requests arriving at different steps
    eng = Engine(model, EngineConfig(max_num_batched_tokens=100, num_kv_blocks=128))
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for i, p in enumerate(prompts[:3]):
        eng.add_request(f"r{i}", p, params)
    steps = 0
    while eng.has_unfinished() or steps < 3:
        if steps == 2:
            for i in (3, 4):
                eng.add_request(f"r{i}", prompts[i], params)
        for o in eng.step():
            got[o.request_id].append(o.token_id)
        steps += 1
    assert [got[f"r{i}"] for i in range(len(prompts))] == alone
    assert eng.kv.num_used_blocks == 0
