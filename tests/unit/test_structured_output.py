"""Structured output in the engine: a JSON Schema compiled by llguidance against the Harmony
vocabulary masks every sampled token, so even a random model writes JSON valid under the schema
and then an end token; the same through the disaggregated calls (prefill_only samples the first
token under the grammar, add_prefilled replays it and goes on); bad schemas and models without the
Harmony vocabulary are clear errors."""

from __future__ import annotations

import json

import pytest

from dayzero.bench import random_model
from dayzero.config import preset
from dayzero.runtime.engine import Engine
from dayzero.runtime.grammar import GrammarError
from dayzero.runtime.sampling import SamplingParams
from dayzero.vocab import load_harmony_encoding, resolve_vocab

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "tag", "items"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": -5, "maximum": 300},
                         "tag": {"enum": ["red", "green"]},
                         "items": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": 0,
                                                                             "maximum": 9}}}}
RETURN = 200002


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    folder = resolve_vocab(cache_dir=tmp_path_factory.mktemp("vocab"), allow_download=False).folder
    mp = pytest.MonkeyPatch()
    mp.setenv("DAYZERO_VOCAB_DIR", str(folder))   # what the engine's grammar compiler resolves
    yield load_harmony_encoding(vocab_dir=folder, allow_download=False)[0]
    mp.undo()


@pytest.fixture(scope="module")
def engine(enc):
    return Engine(random_model(preset("tiny"), "bfloat16", "torch", "cpu", seed=0, max_positions=512))


def _check(enc, ids: list[int]) -> dict:
    assert ids[-1] == RETURN, enc.decode(ids)
    data = json.loads(enc.decode(ids[:-1]))
    assert set(data) == {"ok", "n", "tag", "items"} and type(data["ok"]) is bool and data["tag"] in ("red", "green")
    assert type(data["n"]) is int and -5 <= data["n"] <= 300
    assert len(data["items"]) <= 3 and all(type(x) is int and 0 <= x <= 9 for x in data["items"])
    return data


def test_random_model_writes_valid_json(engine, enc):
    prompts = [[200006, 1000 + i, 2000 + i] for i in range(4)]
    greedy = engine.generate(prompts, SamplingParams(max_tokens=64, json_schema=json.dumps(SCHEMA)))
    sampled = engine.generate(prompts, SamplingParams(max_tokens=64, temperature=1.5, seed=7,
                                                      json_schema=json.dumps(SCHEMA)))
    for ids in greedy + sampled:
        _check(enc, ids)
    # without the schema the same random model does not write that JSON
    free = engine.generate(prompts[:1], SamplingParams(max_tokens=16))[0]
    with pytest.raises((ValueError, AssertionError)):
        _check(enc, free)


def test_prefill_then_decode_keeps_the_grammar(engine, enc):
    params = SamplingParams(max_tokens=64, temperature=1.0, seed=3, json_schema=json.dumps(SCHEMA))
    prompt = [200006, 300, 301, 302]
    first = engine.prefill_only("p1", prompt, params)
    engine.free("p1")
    engine.allocate("d1", len(prompt))
    assert engine.add_prefilled("d1", prompt, first.token_id, params) is None
    out = [first.token_id]
    while engine.has_unfinished():
        out += [o.token_id for o in engine.step() if o.request_id == "d1"]
    _check(enc, out)
    # a first token the grammar does not allow is refused (and the lease stays to be freed)
    engine.allocate("d2", len(prompt))
    with pytest.raises(ValueError, match="does not continue the requested JSON"):
        engine.add_prefilled("d2", prompt, enc.encode("hello", allowed_special=set())[0], params)
    engine.free("d2")
    assert engine.kv.full_alloc.num_used == 0


@pytest.mark.parametrize("schema,match", [('{"type": "nonsense"}', "could not be compiled"),
                                          ('{"type": ', "could not be compiled"),
                                          ("x" * 70000, "at most")])
def test_bad_schema_is_a_clear_error(engine, schema, match):
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", [1, 2, 3], SamplingParams(json_schema=schema))
    assert not engine.has_unfinished()


def test_model_without_the_harmony_vocabulary(enc):
    small = Engine(random_model(preset("tiny2"), "bfloat16", "torch", "cpu", seed=0, max_positions=64))
    with pytest.raises(GrammarError, match="Harmony vocabulary"):
        small.add_request("r", [1, 2], SamplingParams(json_schema='{"type": "object"}'))
    assert small.generate([[1, 2]], SamplingParams(max_tokens=2))  # plain requests still run


def test_json_end_ids_choose_what_follows_the_json(engine, enc):
    """Tool-call arguments end with <|call|> instead of the model's eos; an id that cannot end JSON
    (not an eos or Harmony stop token) is refused."""
    call = enc.encode("<|call|>", allowed_special="all")[0]
    params = SamplingParams(max_tokens=64, temperature=1.0, seed=5, json_schema=json.dumps(SCHEMA),
                            json_end_ids=(call,))
    (out,) = engine.generate([[200006, 11, 12]], params)
    assert out[-1] == call
    _check(enc, out[:-1] + [RETURN])
    with pytest.raises(ValueError, match="cannot end a JSON text"):
        engine.add_request("bad-end", [1, 2], SamplingParams(json_schema='{"type": "object"}', json_end_ids=(5,)))


OTHER = {"type": "object", "additionalProperties": False, "required": ["city"],
         "properties": {"city": {"enum": ["Paris", "Oslo"]}}}


def test_prefix_json_schemas_hold_the_text_after_the_chosen_prefix(engine, enc):
    """tool_choice 'required' among several tools: the output starts with one of the call headers and
    the arguments after it follow that tool's schema, then <|call|>; the prefill/decode split keeps it."""
    call = enc.encode("<|call|>", allowed_special="all")[0]
    heads = [tuple(enc.encode(f" to=functions.{name}<|channel|>commentary json<|message|>", allowed_special="all"))
             for name in ("get_a", "get_weather")]
    params = [SamplingParams(max_tokens=96, temperature=t, seed=s, allowed_prefixes=tuple(heads),
                             prefix_json_schemas=(json.dumps(SCHEMA), json.dumps(OTHER)), json_end_ids=(call,))
              for t, s in ((0.0, None), (1.5, 1), (1.5, 2), (1.5, 3), (1.5, 4))]
    outs = [engine.generate([[200006, 40 + i, 41 + i]], p)[0] for i, p in enumerate(params)]
    first = engine.prefill_only("pp", [200006, 50, 51], params[1])
    engine.free("pp")
    engine.allocate("dd", 3)
    assert engine.add_prefilled("dd", [200006, 50, 51], first.token_id, params[1]) is None
    out = [first.token_id]
    while engine.has_unfinished():
        out += [o.token_id for o in engine.step() if o.request_id == "dd"]
    picked = set()
    for ids in outs + [out]:
        (k,) = [k for k, h in enumerate(heads) if tuple(ids[:len(h)]) == h]
        picked.add(k)
        rest = ids[len(heads[k]):]
        assert rest[-1] == call, enc.decode(ids)
        if k == 0:
            _check(enc, rest[:-1] + [RETURN])
        else:
            assert json.loads(enc.decode(rest[:-1]))["city"] in ("Paris", "Oslo")
    assert not engine.has_unfinished() and engine.kv.full_alloc.num_used == 0


def test_prefix_json_schemas_are_checked_when_the_request_is_added(engine):
    heads = ((11, 12), (13,))
    with pytest.raises(ValueError, match="one per allowed prefix"):
        engine.add_request("pj1", [1, 2], SamplingParams(allowed_prefixes=heads, prefix_json_schemas=("{}",)))
    with pytest.raises(ValueError, match="cannot be combined"):
        engine.add_request("pj2", [1, 2], SamplingParams(allowed_prefixes=heads, prefix_json_schemas=("{}", ""),
                                                         json_schema="{}"))
    with pytest.raises(ValueError, match="could not be compiled"):
        engine.add_request("pj3", [1, 2], SamplingParams(allowed_prefixes=heads,
                                                         prefix_json_schemas=('{"type": "nonsense"}', "")))
    assert not engine.has_unfinished()
