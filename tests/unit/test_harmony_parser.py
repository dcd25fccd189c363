"""The frontend's per-choice Harmony output parser: splits, repairs, and never raising."""

from __future__ import annotations

import json
import random

import pytest

from dayzero.vocab import load_harmony_encoding, resolve_vocab
from dayzero_frontend.harmony import HarmonyChat
from dayzero_frontend.harmony_events import ContentDelta, ReasoningDelta, ToolCallBegin, ToolCallDelta


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> HarmonyChat:
    res = resolve_vocab(cache_dir=tmp_path_factory.mktemp("vocab"), allow_download=False)
    enc, _ = load_harmony_encoding(vocab_dir=res.folder, allow_download=False)
    return HarmonyChat(enc)


def run(chat: HarmonyChat, tokens: list[int], tools=("get_weather",)):
    parser = chat.new_parser(frozenset(tools))
    events = []
    for t in tokens:
        events += parser.feed(t)
    events += parser.finish()
    return parser, events


def ids(chat, text: str) -> list[int]:
    return chat.enc.encode(text, allowed_special="all")


def replay(events):
    """Rebuild content / reasoning / tool calls from the streamed events alone."""
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = {}
    for e in events:
        if isinstance(e, ToolCallBegin):
            calls[e.index] = [e.name, ""]
        elif isinstance(e, ToolCallDelta):
            calls[e.index][1] += e.arguments
    return content, reasoning, [tuple(calls[i]) for i in sorted(calls)]


def test_reasoning_then_answer(chat):
    thought, answer = "The user greets me.", "Hello! How can I help?"
    p, events = run(chat, ids(chat, f"<|channel|>analysis<|message|>{thought}<|end|>"
                                    f"<|start|>assistant<|channel|>final<|message|>{answer}<|return|>"))
    assert (p.content, p.reasoning, p.tool_calls, p.done, p.anomalies) == (answer, thought, [], True, [])
    assert replay(events) == (answer, thought, [])
    assert p.reasoning_tokens == len(chat.enc.encode(thought))


def test_tool_call_events_begin_with_id_and_name(chat):
    args = json.dumps({"city": "Paris", "unit": "celsius"})
    p, events = run(chat, ids(chat, "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                                    f"<|message|>{args}<|call|>"))
    begins = [e for e in events if isinstance(e, ToolCallBegin)]
    assert len(begins) == 1 and begins[0].name == "get_weather" and begins[0].call_id.startswith("call_")
    assert events.index(begins[0]) == 0
    assert replay(events) == ("", "", [("get_weather", args)])
    assert p.done and p.anomalies == []


def test_preamble_is_content(chat):
    pre = "Let me look that up."
    p, events = run(chat, ids(chat, f"<|channel|>commentary<|message|>{pre}<|end|><|start|>assistant"
                                    "<|channel|>commentary to=functions.get_weather<|message|>{}<|call|>"))
    assert replay(events) == (pre, "", [("get_weather", "{}")])


def test_end_is_not_a_stop(chat):
    p, _ = run(chat, ids(chat, "<|channel|>analysis<|message|>a<|end|>"))
    assert not p.done
    p.feed(ids(chat, "<|start|>")[0])
    assert not p.done


@pytest.mark.parametrize("stop", ["<|return|>", "<|call|>", "<|endoftext|>"])
def test_tokens_after_a_stop_are_ignored(chat, stop):
    p, events = run(chat, ids(chat, f"<|channel|>final<|message|>done{stop}more text<|start|>assistant"))
    assert p.done and replay(events)[0] == "done"
    assert "tokens_after_stop" in p.anomalies


def test_special_tokens_inside_content_are_dropped(chat):
    p, events = run(chat, ids(chat, "<|channel|>final<|message|>a<|reserved_200013|>b<|message|>c<|constrain|>d<|return|>"))
    assert replay(events)[0] == "abcd"
    assert p.anomalies.count("stray_special_in_content") == 3


def test_plain_text_without_any_header_becomes_content(chat):
    words = "plain words without a header " * 20
    p, events = run(chat, ids(chat, words))
    assert replay(events)[0] == words
    assert "text_without_header" in p.anomalies


def test_short_unfinished_header_is_dropped_and_counted(chat):
    p, events = run(chat, ids(chat, "<|channel|>ana"))
    assert events == [] and p.anomalies == ["incomplete_header"]


def test_utf8_split_across_tokens(chat):
    text = "naïve café 🌍 世界"
    _, events = run(chat, ids(chat, f"<|channel|>final<|message|>{text}<|return|>"))
    assert replay(events)[0] == text


def test_random_token_streams_never_raise(chat):
    """Fuzz: random mixes of ordinary and special ids. Every call returns; replayed events agree
    with the parser's own accumulators; content never holds a special token's text."""
    rng = random.Random(1234)
    specials = sorted({*ids(chat, "<|start|><|end|><|message|><|channel|><|constrain|><|return|><|call|>"
                                 "<|endoftext|><|reserved_200013|><|startoftext|>")})
    words = ids(chat, " to=functions.get_weather analysis final commentary json {\"a\": 1} user assistant")
    for _ in range(1500):
        n = rng.randrange(0, 48)
        tokens = [rng.choice(specials) if rng.random() < 0.3 else
                  (rng.choice(words) if rng.random() < 0.6 else rng.randrange(0, 199998)) for _ in range(n)]
        p, events = run(chat, tokens)
        content, reasoning, calls = replay(events)
        assert (content, reasoning) == (p.content, p.reasoning)
        assert calls == [(c.name, c.arguments) for c in p.tool_calls]
        assert "<|start|>" not in content and "<|channel|>" not in content
        assert all(not a.startswith("parser_error") for a in p.anomalies), (tokens, p.anomalies)
