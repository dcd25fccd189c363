"""Structured output through the official openai client against the real frontend process:
``response_format`` json_schema / json_object, and forced tool calls whose arguments follow the
function's parameters schema. The router side is the scripted router TEST DOUBLE (checks what the
frontend sends: the final-channel header, the schema, the end token), then the whole real stack on
the tiny random model, where the constrained sampler must make even random output parse and
validate (decode-only and, with a long prompt, disaggregated).
"""

from __future__ import annotations

import json

import pytest

import frontend_harness as fh
from frontend_client import MODE_IDS, MODES, ask_chat

pytestmark = pytest.mark.e2e

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 48


MODE_TOOL = {"type": "function", "function": {"name": "set_mode", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["mode", "level"],
    "properties": {"mode": {"enum": ["eco", "fast"]}, "level": {"type": "integer", "minimum": 0, "maximum": 5}}}}}


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_forced_tool_call_arguments_follow_the_schema(s, mode):
    """A forced call's arguments are held to its parameters schema and end with <|call|> (on the real
    stack the random model's arguments parse and validate)."""
    s.router.script(s.chunked('{"mode": "eco", "level": 3}<|call|>'))
    out = ask_chat(s.frontend.base_url, mode, model=fh.MODEL_NAME, messages=USER, tools=[MODE_TOOL],
                   tool_choice={"type": "function", "function": {"name": "set_mode"}}, max_tokens=MAX_TOKENS,
                   temperature=1.0, seed=2)
    (c,) = out.choices
    ((_, name, args),) = c.tool_calls
    data = json.loads(args)
    assert name == "set_mode" and c.finish_reason == "tool_calls", c
    assert set(data) == {"mode", "level"} and data["mode"] in ("eco", "fast") and data["level"] in range(6), data
    if s.router.scripted:
        (rec,) = s.router.requests()
        assert json.loads(rec["sampling"]["json_schema"]) == MODE_TOOL["function"]["parameters"]
        assert [int(t) for t in rec["sampling"]["json_end_ids"]] == s.ids("<|call|>")


WEATHER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "celsius", "sunny"],
                  "properties": {"city": {"enum": ["Paris", "Rome"]}, "sunny": {"type": "boolean"},
                                 "celsius": {"type": "integer", "minimum": -40, "maximum": 50}}}


@pytest.mark.parametrize("words", [1, 300], ids=["decode-only", "disaggregated"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_structured_output_json_schema(s, mode, words):
    """response_format json_schema: the frontend goes straight to the final channel and sends the
    schema; the samplers (on the real stack: the prefill worker's first token for the long prompt,
    the decode worker's the rest) keep the answer JSON valid under it, so even the random model's
    answer parses and validates."""
    answer = '{"city": "Paris", "celsius": 18, "sunny": true}'
    s.router.script(s.chunked(f"{answer}<|return|>"))
    messages = [{"role": "user", "content": "Weather in Paris as JSON." + " word" * words}]
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA, "strict": True}}
    out = ask_chat(s.frontend.base_url, mode, model=fh.MODEL_NAME, messages=messages, response_format=fmt,
                   max_tokens=MAX_TOKENS, temperature=1.0, seed=11)
    (c,) = out.choices
    data = json.loads(c.content)
    assert set(data) == {"city", "celsius", "sunny"} and data["city"] in ("Paris", "Rome"), data
    assert type(data["celsius"]) is int and -40 <= data["celsius"] <= 50 and type(data["sunny"]) is bool, data
    assert c.finish_reason == "stop" and not c.tool_calls
    if s.router.scripted:
        (rec,) = s.router.requests()
        assert rec["prompt_token_ids"][-3:] == s.ids("<|channel|>final<|message|>")
        assert json.loads(rec["sampling"]["json_schema"]) == WEATHER_SCHEMA
        assert data == json.loads(answer)


def test_structured_output_json_object(s):
    """response_format json_object: any JSON object; the schema sent is {"type": "object"}."""
    s.router.script(s.chunked('{"a": [1, 2]}<|return|>'))
    out = ask_chat(s.frontend.base_url, ("sync", False), model=fh.MODEL_NAME, messages=USER,
                   response_format={"type": "json_object"}, max_tokens=MAX_TOKENS, temperature=0)
    (c,) = out.choices
    if s.router.scripted:
        assert json.loads(c.content) == {"a": [1, 2]}
        assert json.loads(s.router.requests()[0]["sampling"]["json_schema"]) == {"type": "object"}
    elif c.finish_reason == "stop":   # a random model may fill max_tokens inside one long string
        assert isinstance(json.loads(c.content), dict)
    else:
        assert c.content.startswith("{")
