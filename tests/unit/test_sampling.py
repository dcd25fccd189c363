"""Sampler: greedy, seeds, top-k / top-p / min-p masks, logprobs; stop ids and max_tokens in the engine."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dayzero.runtime.sampling import SampleRequest, Sampler, SamplingParams, filtered_probs


def _logits(B=4, V=50, seed=0):
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * 3


def _one(params: SamplingParams):
    t = torch.tensor
    return (t([params.temperature]), t([params.top_k]), t([params.top_p]), t([params.min_p]))


def test_greedy_is_argmax_and_ignores_seed():
    logits = _logits()
    reqs = [SampleRequest(SamplingParams(), seed=s, step=0) for s in range(4)]
    assert [s.token_id for s in Sampler()(logits, reqs)] == logits.argmax(-1).tolist()


def test_seed_reproducible_and_independent_of_batch():
    logits = _logits(B=3, V=200, seed=1)
    p = SamplingParams(temperature=1.0)
    reqs = [SampleRequest(p, seed=11, step=0), SampleRequest(p, seed=12, step=0), SampleRequest(p, seed=11, step=5)]
    a = [s.token_id for s in Sampler()(logits, reqs)]
    b = [s.token_id for s in Sampler()(logits, reqs)]
    assert a == b
    alone = [Sampler()(logits[i:i + 1], [reqs[i]])[0].token_id for i in range(3)]
    assert alone == a
    # different seeds / steps give different streams (over many draws)
    row = logits[:1]
    draws = {s: [Sampler()(row, [SampleRequest(p, s, k)])[0].token_id for k in range(40)] for s in (1, 2)}
    assert draws[1] != draws[2]


def test_sampling_follows_the_distribution():
    V = 6
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05, 0.0]]) + 1e-12)
    p = SamplingParams(temperature=1.0)
    counts = torch.zeros(V)
    n = 3000
    for k in range(n):
        counts[Sampler()(logits, [SampleRequest(p, 7, k)])[0].token_id] += 1
    freq = counts / n
    assert (freq - torch.softmax(logits[0], -1)).abs().max() < 0.03
    assert counts[5] == 0


def _independent_filter(row: torch.Tensor, temperature, top_k, top_p, min_p) -> set[int]:
    """Tokens a plain-python reading of the filter rules keeps."""
    probs = torch.softmax(row / temperature, -1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    if top_k:
        order = order[:top_k]
    z = sum(probs[i] for i in order)
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.append(i)
        mass += probs[i] / z
    pmax = probs[order[0]]
    return {i for i in kept if probs[i] >= min_p * pmax}


@pytest.mark.parametrize("top_k,top_p,min_p", [(5, 1.0, 0.0), (0, 0.7, 0.0), (0, 1.0, 0.2), (8, 0.9, 0.05),
                                               (1, 1.0, 0.0), (0, 0.01, 0.0)])
def test_filter_masks(top_k, top_p, min_p):
    logits = _logits(B=1, V=64, seed=3)
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, min_p=min_p)
    probs, order = filtered_probs(logits, *_one(params))
    kept = {int(order[0, j]) for j in range(probs.shape[1]) if probs[0, j] > 0}
    assert kept == _independent_filter(logits[0], 0.8, top_k, top_p, min_p)
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-5)
    # sampled tokens always come from the kept set
    drawn = {Sampler()(logits, [SampleRequest(params, 5, k)])[0].token_id for k in range(100)}
    assert drawn <= kept


def test_logprobs_consistent():
    V = 16
    logits = _logits(B=2, V=V, seed=4)
    reqs = [SampleRequest(SamplingParams(logprobs=V), 0, 0),
            SampleRequest(SamplingParams(temperature=1.5, logprobs=3, seed=9), 9, 0)]
    out = Sampler()(logits, reqs)
    full = torch.log_softmax(logits, -1)
    # all V alternatives of row 0 form the whole distribution: their probabilities sum to one
    assert math.isclose(sum(math.exp(lp) for _, lp in out[0].top_logprobs), 1.0, rel_tol=1e-5)
    for i, s in enumerate(out):
        assert math.isclose(s.logprob, float(full[i, s.token_id]), rel_tol=1e-6)
        lps = [lp for _, lp in s.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert [t for t, _ in s.top_logprobs] == full[i].topk(len(lps)).indices.tolist()
    assert len(out[1].top_logprobs) == 3
    assert Sampler()(logits, [SampleRequest(SamplingParams(), 0, 0)] * 2)[0].logprob is None


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0.0), dict(top_k=-2), dict(min_p=1.5),
                                 dict(max_tokens=0), dict(seed=-1), dict(logprobs=99), dict(stop_token_ids=(-3,))])
def test_bad_params_are_refused(bad):
    with pytest.raises(ValueError, match="invalid sampling parameters"):
        SamplingParams(**bad).validate()


def test_stop_ids_and_max_tokens_in_engine(make_ckpt):
    from dayzero.runtime.engine import Engine, EngineConfig

    eng = Engine.from_dir(make_ckpt("tiny2"), dtype="float32", config=EngineConfig(num_kv_blocks=32), max_positions=256)
    prompt = list(range(10, 30))
    free_run = eng.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert len(free_run) == 8
    stop = free_run[3]
    first = free_run.index(stop)
    eng.add_request("a", prompt, SamplingParams(max_tokens=8, ignore_eos=True, stop_token_ids=(stop,)))
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert [o.token_id for o in outs] == free_run[:first + 1]
    assert outs[-1].finished and outs[-1].finish_reason == "stop"
    assert not any(o.finished for o in outs[:-1])
    eng.add_request("b", prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert [o.token_id for o in outs] == free_run[:5] and outs[-1].finish_reason == "length"
    # seeded sampling through the engine is reproducible
    sp = SamplingParams(max_tokens=6, temperature=1.0, seed=123, ignore_eos=True)
    assert eng.generate([prompt], sp) == eng.generate([prompt], sp)
    assert eng.kv.num_used_blocks == 0


def test_logit_bias_forces_and_bans_tokens_greedy_and_sampled():
    from dayzero.runtime.sampling import SampleRequest, Sampler, SamplingParams

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g)
    top = int(logits[0].argmax())
    sampler = Sampler()
    force = SamplingParams(logit_bias=((7, 100.0),))
    ban = SamplingParams(logit_bias=((top, -100.0),))
    hot = SamplingParams(temperature=1.0, logit_bias=((7, 100.0),))
    out = sampler(logits, [SampleRequest(force, 1, 0), SampleRequest(ban, 1, 0), SampleRequest(hot, 3, 0)])
    assert out[0].token_id == 7 and out[2].token_id == 7
    assert out[1].token_id != top and out[1].token_id == int(logits[1].masked_fill(
        torch.arange(50) == top, float("-inf")).argmax())
    # logprobs stay those of the raw distribution
    lp = sampler(logits[:1], [SampleRequest(SamplingParams(logprobs=0, logit_bias=((7, 100.0),)), 1, 0)])[0]
    assert lp.logprob == pytest.approx(float(torch.log_softmax(logits[0], -1)[7]))


def test_presence_and_frequency_penalties_follow_the_generated_tokens():
    from dayzero.runtime.sampling import SampleRequest, Sampler, SamplingParams

    logits = torch.zeros(1, 10)
    logits[0, 3], logits[0, 5] = 1.0, 0.9
    sampler = Sampler()
    assert sampler(logits, [SampleRequest(SamplingParams(presence_penalty=0.2), 1, 1, [3])])[0].token_id == 5
    assert sampler(logits, [SampleRequest(SamplingParams(presence_penalty=0.05), 1, 1, [3])])[0].token_id == 3
    # frequency counts occurrences: 3 seen twice at 0.06 each drops 0.12 below 5
    assert sampler(logits, [SampleRequest(SamplingParams(frequency_penalty=0.06), 1, 2, [3, 3])])[0].token_id == 5
    assert sampler(logits, [SampleRequest(SamplingParams(frequency_penalty=0.06), 1, 1, [3])])[0].token_id == 3
    # a negative penalty favours repeats
    assert sampler(logits, [SampleRequest(SamplingParams(presence_penalty=-0.5), 1, 1, [5])])[0].token_id == 5


@pytest.mark.parametrize("params, fragment", [
    (dict(presence_penalty=2.5), "presence_penalty must be in [-2, 2]"),
    (dict(frequency_penalty=-2.1), "frequency_penalty must be in [-2, 2]"),
    (dict(logit_bias=((3, 101.0),)), "logit_bias maps token ids"),
    (dict(logit_bias=((-1, 1.0),)), "logit_bias maps token ids"),
])
def test_penalty_and_bias_validation(params, fragment):
    from dayzero.runtime.sampling import SamplingParams

    with pytest.raises(ValueError, match=re.escape(fragment)):
        SamplingParams(**params).validate()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        SamplingParams(logit_bias=((50, 1.0),)).check_vocab(50)


def test_allowed_prefixes_steer_the_start_of_the_output_then_let_go():
    from dayzero.runtime.sampling import SampleRequest, Sampler, SamplingParams

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 40, generator=g)
    favourite = int(logits[0].argmax())
    seqs = ((5, 6, 7), (5, 9), (11,))
    sampler = Sampler()
    for temp, seed in ((0.0, 0), (1.0, 3), (1.0, 4)):
        params = SamplingParams(temperature=temp, allowed_prefixes=seqs)
        out: list[int] = []
        for step in range(4):
            out.append(sampler(logits, [SampleRequest(params, seed, step, list(out))])[0].token_id)
        starts = [seq for seq in seqs if tuple(out[:len(seq)]) == seq]
        assert starts, (temp, out)  # the output starts with one of the sequences
        if temp == 0 and len(starts[0]) < 4:
            assert out[len(starts[0])] == favourite  # after it, the raw argmax again
    # only one way to continue after 5, 6
    assert Sampler()(logits, [SampleRequest(SamplingParams(allowed_prefixes=seqs), 0, 2, [5, 6])])[0].token_id == 7
    with pytest.raises(ValueError, match="allowed_prefixes"):
        SamplingParams(allowed_prefixes=((),)).validate()
