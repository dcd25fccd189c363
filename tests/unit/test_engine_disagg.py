"""The engine's disaggregated calls: a prefill engine computes the KV, the blocks are copied into the
blocks a decode engine allocated (by the transfer view: per layer, paired block lists), and the
decode engine continues. Tokens equal those of one engine doing everything."""

from __future__ import annotations

import pytest
import torch

from dayzero.runtime.engine import Engine, EngineConfig
from dayzero.runtime.sampling import SamplingParams
from dayzero.weights.loader import load_model


@pytest.fixture(scope="module")
def model(make_ckpt):
    return load_model(make_ckpt("tiny2"), dtype="float32", max_positions=1024)


def _copy_kv(src: Engine, dst: Engine, rid: str, n: int, dst_blocks: list[list[int]]) -> int:
    """A stand-in transport (test double at the transfer seam): copies paired blocks layer by layer."""
    src_blocks = src.kv.layer_blocks(rid, n)
    src_t = {(layer, kind): t for layer, kind, t in src.kv.layer_tensors()}
    dst_t = {(layer, kind): t for layer, kind, t in dst.kv.layer_tensors()}
    copied = 0
    for layer, (s, d) in enumerate(zip(src_blocks, dst_blocks)):
        assert len(s) == len(d)
        for kind in ("k", "v"):
            dst_t[(layer, kind)][torch.tensor(d)] = src_t[(layer, kind)][torch.tensor(s)]
            copied += len(s)
    return copied


def _disaggregated(model, prompt, params, rid="req"):
    P = Engine(model, EngineConfig(num_kv_blocks=64, max_num_batched_tokens=64))
    D = Engine(model, EngineConfig(num_kv_blocks=64))
    D.allocate("someone-else", 33)  # so the decode side's block ids differ from the prefill side's
    alloc = D.allocate(rid, len(prompt))
    chunks = []
    first = P.prefill_only(rid, prompt, params, on_chunk=lambda r, n: chunks.append(n))
    assert chunks == list(range(64, len(prompt), 64)) + [len(prompt)]
    _copy_kv(P, D, rid, len(prompt), alloc.layer_blocks)
    assert P.free(rid) and P.kv.num_used_blocks == 0
    assert D.add_prefilled(rid, prompt, first.token_id, params) is None
    toks = [first.token_id]
    while D.has_unfinished():
        toks += [o.token_id for o in D.step() if o.request_id == rid]
    D.free("someone-else")
    assert D.kv.num_used_blocks == 0
    return toks


@pytest.mark.parametrize("n", [5, 140, 300])
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=10, ignore_eos=True),
                                    SamplingParams(max_tokens=10, ignore_eos=True, temperature=1.0, seed=42)],
                         ids=["greedy", "seeded"])
def test_disaggregated_equals_single_engine(model, n, params):
    prompt = torch.randint(0, model.cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    single = Engine(model, EngineConfig(num_kv_blocks=64)).generate([prompt], params)[0]
    assert _disaggregated(model, prompt, params) == single


def test_wrong_kv_gives_different_tokens(model):
    """The equality above can fail: a decode engine whose blocks were not filled decodes differently."""
    prompt = torch.randint(0, model.cfg.vocab_size, (140,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    single = Engine(model, EngineConfig(num_kv_blocks=64)).generate([prompt], params)[0]
    P, D = Engine(model, EngineConfig(num_kv_blocks=64)), Engine(model, EngineConfig(num_kv_blocks=64))
    D.allocate("r", len(prompt))
    first = P.prefill_only("r", prompt, params)
    D.add_prefilled("r", prompt, first.token_id, params)  # no copy
    toks = [first.token_id]
    while D.has_unfinished():
        toks += [o.token_id for o in D.step()]
    assert toks != single


def test_disaggregated_api_errors_and_early_finish(model):
    D = Engine(model, EngineConfig(num_kv_blocks=16))
    with pytest.raises(ValueError, match="needs a prior allocate"):
        D.add_prefilled("x", [1, 2, 3], 4)
    D.allocate("x", 3)
    with pytest.raises(ValueError, match="only 3 allocated"):
        D.add_prefilled("x", [1, 2, 3, 4, 5], 4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        D.add_prefilled("x", [1, 2, 3], model.cfg.vocab_size)
    # a first token that already ends the request: finish reason returned, lease freed
    assert D.add_prefilled("x", [1, 2, 3], 4, SamplingParams(max_tokens=1)) == "length"
    assert D.kv.num_used_blocks == 0
    D.allocate("y", 3)
    assert D.add_prefilled("y", [1, 2, 3], 7, SamplingParams(stop_token_ids=(7,))) == "stop"
    assert D.kv.num_used_blocks == 0 and not D.has_unfinished()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        D.prefill_only("z", [1, -2])
    assert D.kv.num_used_blocks == 0
