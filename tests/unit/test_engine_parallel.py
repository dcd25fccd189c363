"""TP/EP sharding of the engine's weight loaders and layers, on CPU: two ranks run as two threads whose
``all_reduce`` is a barrier-based in-process sum (a test double at the collective seam; the real one is
NCCL). Logits and greedy tokens equal the single-rank engine's."""

from __future__ import annotations

import threading

import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.model.layers import ParallelConfig
from dayzero.runtime.engine import Engine, EngineConfig
from dayzero.runtime.sampling import SamplingParams
from dayzero.weights.loader import load_model

# 4 query / 2 KV heads and 8 experts: splits over 2 ranks
CFG = ModelConfig(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                  num_experts_per_tok=2, eos_token_id=1, pad_token_id=0)


class InProcessAllReduce:
    """Sum over ``world`` threads, in rank order (so every rank gets bit-identical results)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * world

    def for_rank(self, rank: int):
        def all_reduce(x: torch.Tensor) -> None:
            self.slots[rank] = x.clone()
            self.barrier.wait()
            total = self.slots[0].clone()
            for t in self.slots[1:]:
                total += t
            self.barrier.wait()
            x.copy_(total)
        return all_reduce


def _run_ranks(fn, world: int):
    results, errors = [None] * world, []

    def body(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("tp,ep", [(2, 1), (1, 2), (2, 2)])
def test_sharded_ranks_match_single_rank(make_ckpt, tp, ep):
    d = make_ckpt(CFG)
    prompts = [torch.randint(0, CFG.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (150, 20)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    single = Engine(load_model(d, dtype="float32", max_positions=256), EngineConfig(num_kv_blocks=64))
    want = single.generate(prompts, params)
    world = max(tp, ep)
    comm = InProcessAllReduce(world)

    def rank_fn(rank):
        par = ParallelConfig(tp_rank=rank % tp, tp_size=tp, ep_rank=rank % ep, ep_size=ep,
                             all_reduce=comm.for_rank(rank))
        model = load_model(d, dtype="float32", max_positions=256, parallel=par)
        assert model.model.layers[0].self_attn.num_heads == CFG.num_attention_heads // tp
        assert model.model.layers[0].mlp.experts.num_local == CFG.num_local_experts // ep
        eng = Engine(model, EngineConfig(num_kv_blocks=64))
        return eng.generate(prompts, params)

    got = _run_ranks(rank_fn, world)
    assert all(g == want for g in got)
