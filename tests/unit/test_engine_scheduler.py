"""Continuous batching under pressure: decodes keep flowing during long chunked prefills; random
arrivals, aborts and a tight KV cache (preemption) still give each request its solo greedy tokens
and leave no block behind."""

from __future__ import annotations

import random

import pytest
import torch

from dayzero.runtime.engine import Engine, EngineConfig
from dayzero.runtime.sampling import SamplingParams
from dayzero.weights.loader import load_model


@pytest.fixture(scope="module")
def model(make_ckpt):
    return load_model(make_ckpt("tiny2"), dtype="float32", max_positions=1024)


def _prompt(n, seed):
    return torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_decodes_continue_during_a_long_chunked_prefill(model):
    eng = Engine(model, EngineConfig(num_kv_blocks=128, max_num_batched_tokens=32))
    eng.add_request("short", _prompt(5, 1), SamplingParams(max_tokens=30, ignore_eos=True))
    eng.step()  # "short" prefilled, first token out
    eng.add_request("long", _prompt(600, 2), SamplingParams(max_tokens=2, ignore_eos=True))
    steps_until_long = 0
    while True:
        outs = {o.request_id for o in eng.step()}
        assert "short" in outs  # one decode token every step while "long" prefills 31 tokens at a time
        if "long" in outs:
            break
        steps_until_long += 1
    assert steps_until_long >= 600 // 32 - 1
    while eng.has_unfinished():
        eng.step()
    assert eng.kv.num_used_blocks == 0


def test_random_traffic_with_aborts_and_preemption(model):
    rng = random.Random(0)
    specs = [(f"r{i}", _prompt(rng.choice([1, 3, 17, 64, 129, 200]), 100 + i), rng.randint(1, 40))
             for i in range(14)]
    alone = {rid: Engine(model, EngineConfig(num_kv_blocks=64)).generate(
        [p], SamplingParams(max_tokens=m, ignore_eos=True))[0] for rid, p, m in specs}
    eng = Engine(model, EngineConfig(num_kv_blocks=24, max_num_batched_tokens=96, max_num_seqs=6))
    pending = list(specs)
    got: dict[str, list[int]] = {rid: [] for rid, _, _ in specs}
    finished, aborted = set(), set()
    step = 0
    while pending or eng.has_unfinished():
        for _ in range(rng.randint(0, 3)):
            if pending:
                rid, p, m = pending.pop(0)
                eng.add_request(rid, p, SamplingParams(max_tokens=m, ignore_eos=True))
        if step % 7 == 3:
            live = [rid for rid in got if rid in eng.requests]
            if live:
                victim = rng.choice(live)
                assert eng.abort(victim)
                aborted.add(victim)
        for o in eng.step():
            assert o.request_id not in aborted and o.request_id not in finished
            got[o.request_id].append(o.token_id)
            if o.finished:
                finished.add(o.request_id)
        step += 1
        assert step < 2000
    assert eng.scheduler.num_preemptions > 0
    for rid, _, _ in specs:
        if rid in finished:
            assert got[rid] == alone[rid], rid
        else:
            assert rid in aborted and got[rid] == alone[rid][:len(got[rid])]
    assert len(finished) >= 5
    assert eng.kv.num_used_blocks == 0 and not eng.requests


def test_warmup_without_graphs_is_a_no_op(make_ckpt):
    from dayzero.runtime.engine import Engine

    engine = Engine.from_dir(make_ckpt("tiny2"), dtype="float32")
    assert engine.runner.graphs is None  # CPU + torch backend: eager only
    assert engine.warmup() == 0
