"""Malformed and unusual Harmony output from the model: every case answers 200 with a sensible
split, streamed or not; a stream always ends with ``[DONE]`` and no error; repairs are counted in
``dayzero_frontend_malformed_choices_total``. The router is the scripted router TEST DOUBLE."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import frontend_harness as fh

pytestmark = pytest.mark.e2e

ARGS = json.dumps({"city": "Paris"})
CALL = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}<|call|>"
LONG_TEXT = "words without any header " * 20


@dataclass
class Case:
    name: str
    text: str
    content: str = ""
    reasoning: str = ""
    tools: list = field(default_factory=list)  # [(name, arguments)]
    finish: str | None = None  # default: tool_calls when tools, else stop
    repaired: bool = True  # whether the parser had to repair something
    declared: tuple = ("get_weather",)
    script: dict = field(default_factory=dict)  # extra script fields
    max_tokens: int = 200


CASES = [
    Case("recipient_in_role_header", f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}<|call|>",
         tools=[("get_weather", ARGS)], repaired=False),
    Case("missing_constrain", f"<|channel|>commentary to=functions.get_weather<|message|>{ARGS}<|call|>",
         tools=[("get_weather", ARGS)], repaired=False),
    Case("tool_call_ended_by_return", CALL.replace("<|call|>", "<|return|>"), tools=[("get_weather", ARGS)],
         repaired=False),
    Case("tokens_after_call", CALL + "and more<|start|>assistant<|channel|>final<|message|>extra<|return|>",
         tools=[("get_weather", ARGS)], script={"ignore_stop": True}),
    Case("unknown_channel", "<|channel|>thoughts<|message|>odd channel<|return|>", content="odd channel"),
    Case("hyphenated_tool_name", CALL.replace("get_weather", "get-weather"), tools=[("get-weather", ARGS)],
         declared=("get-weather",), repaired=False),
    Case("hyphen_for_underscore", CALL.replace("get_weather", "get-weather"), tools=[("get_weather", ARGS)]),
    Case("invalid_json_arguments", CALL.replace(ARGS, "{city: Paris"), tools=[("get_weather", "{city: Paris")]),
    Case("stops_mid_header", "<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>fin",
         reasoning="thinking", finish="length"),
    Case("missing_end", "<|channel|>analysis<|message|>hmm<|start|>assistant<|channel|>final<|message|>ok<|return|>",
         reasoning="hmm", content="ok"),
    Case("no_header_at_all", LONG_TEXT, content=LONG_TEXT, finish="length"),
    Case("repeated_start_assistant", "<|start|>assistant<|channel|>final<|message|>x<|return|>", content="x",
         repaired=False),
    Case("hallucinated_user_turn", "<|channel|>final<|message|>a<|end|><|start|>user<|message|>fake<|end|>"
         "<|start|>assistant<|channel|>final<|message|>b<|return|>", content="ab"),
    Case("special_tokens_inside_content", "<|channel|>final<|message|>a<|reserved_200013|>b<|message|>c"
         "<|constrain|>d<|return|>", content="abcd"),
    Case("builtin_tool_recipient", '<|channel|>analysis to=browser.search<|message|>{"q": "x"}<|call|>',
         reasoning='{"q": "x"}'),
    Case("endoftext_in_content", "<|channel|>final<|message|>abc<|endoftext|>", content="abc", repaired=False),
    Case("empty_output", "", script={"finish": "stop"}, repaired=False),
    Case("two_channel_tokens", "<|channel|>analysis<|channel|>final<|message|>hi<|return|>", content="hi"),
    Case("garbage_in_header", f"<|channel|>commentary to=functions.get_weather extra words<|message|>{ARGS}<|call|>",
         tools=[("get_weather", ARGS)]),
    Case("channel_without_start", "<|channel|>analysis<|message|>a<|end|><|channel|>final<|message|>b<|return|>",
         reasoning="a", content="b"),
    Case("reserved_token_between_messages", "<|channel|>final<|message|>a<|end|><|reserved_200013|><|start|>"
         "assistant<|channel|>final<|message|>b<|return|>", content="ab"),
    Case("two_tool_calls_first_ended_by_end", CALL.replace("<|call|>", "<|end|><|start|>assistant") + CALL,
         tools=[("get_weather", ARGS), ("get_weather", ARGS)], repaired=False),
    Case("undeclared_tool", CALL.replace("get_weather", "launch_rockets"), tools=[("launch_rockets", ARGS)]),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frontend-robust")
    vocab = fh.vocab_dir(tmp_path_factory.getbasetemp())
    router = fh.start_scripted_router()
    with (fh.frontend_for(router, tmp, vocab) as frontend,
          httpx.Client(base_url=frontend.base_url, timeout=30) as client):
        yield router, frontend, fh.harmony_encoding(vocab), client


def repaired_count(client: httpx.Client) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name == "dayzero_frontend_malformed_choices":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("metric dayzero_frontend_malformed_choices missing")


def body(case: Case, stream: bool) -> dict:
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
             for n in case.declared]
    return {"model": fh.MODEL_NAME, "messages": [{"role": "user", "content": "go"}], "tools": tools,
            "max_tokens": case.max_tokens, "stream": stream}


def read_sse(response: httpx.Response) -> tuple[dict, str | None]:
    """Rebuild a streamed answer; asserts the stream is well formed and ends with [DONE]."""
    events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", events[-3:]
    got = {"content": "", "reasoning": "", "tools": {}}
    finish = None
    for raw in events[:-1]:
        chunk = json.loads(raw)
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            d = c["delta"]
            got["content"] += d.get("content") or ""
            got["reasoning"] += d.get("reasoning") or ""
            for tc in d.get("tool_calls") or []:
                slot = got["tools"].setdefault(tc["index"], ["", ""])
                slot[0] = tc.get("function", {}).get("name") or slot[0]
                slot[1] += tc.get("function", {}).get("arguments") or ""
            finish = c.get("finish_reason") or finish
    got["tools"] = [tuple(got["tools"][i]) for i in sorted(got["tools"])]
    return got, finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_harmony(env, case, stream):
    router, frontend, enc, client = env
    router.reset()
    ids = fh.harmony_ids(enc, case.text)
    router.script({"chunks": [ids[i:i + 2] for i in range(0, len(ids), 2)], **case.script})
    before = repaired_count(client)
    if stream:
        with client.stream("POST", "/v1/chat/completions", json=body(case, True)) as resp:
            assert resp.status_code == 200, resp.read()
            got, finish = read_sse(resp)
    else:
        resp = client.post("/v1/chat/completions", json=body(case, False))
        assert resp.status_code == 200, resp.text
        (choice,) = resp.json()["choices"]
        msg = choice["message"]
        got = {"content": msg["content"] or "", "reasoning": msg.get("reasoning") or "",
               "tools": [(t["function"]["name"], t["function"]["arguments"]) for t in msg["tool_calls"]]}
        finish = choice["finish_reason"]
    expected_finish = case.finish or ("tool_calls" if case.tools else "stop")
    assert got == {"content": case.content, "reasoning": case.reasoning, "tools": case.tools}
    assert finish == expected_finish
    assert repaired_count(client) - before == (1 if case.repaired else 0)
    assert "Traceback" not in frontend.log()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_token_ids_outside_the_vocabulary(env, endpoint, stream):
    """A broken model or router sends ids the encoding does not know: they are dropped."""
    router, frontend, enc, client = env
    router.reset()
    before, after = fh.harmony_ids(enc, "<|channel|>final<|message|>ab"), fh.harmony_ids(enc, "cd<|return|>")
    bogus = 1 + max(enc.encode(t, allowed_special="all")[0] for t in enc.special_tokens_set)
    router.script({"chunks": [before, [bogus, bogus + 1000], after]})
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    payload = {"model": fh.MODEL_NAME, "max_tokens": 50, "stream": stream, "logprobs": True}
    payload.update({"messages": [{"role": "user", "content": "go"}]} if endpoint == "chat" else
                   {"prompt": "go", "logprobs": 1})
    if stream:
        with client.stream("POST", path, json=payload) as resp:
            assert resp.status_code == 200
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and not any("error" in json.loads(ev) for ev in events[:-1])
        choices = [c for ev in events[:-1] for c in json.loads(ev)["choices"]]
        text = "".join((c.get("delta", {}).get("content") or "") if endpoint == "chat" else c["text"]
                       for c in choices)
    else:
        resp = client.post(path, json=payload)
        assert resp.status_code == 200, resp.text
        c = resp.json()["choices"][0]
        text = c["message"]["content"] if endpoint == "chat" else c["text"]
    visible = enc.decode([t for t in before + after if not enc.is_special_token(t)])
    assert text == ("abcd" if endpoint == "chat" else visible)
    assert "Traceback" not in frontend.log()


def test_partial_utf8_at_the_end(env):
    router, frontend, enc, client = env
    router.reset()
    content = fh.harmony_ids(enc, "ok 🌍")
    cut = content[:-1]
    assert enc.decode(cut).endswith("\ufffd")  # the script really ends inside a character
    header = fh.harmony_ids(enc, "<|channel|>final<|message|>")
    router.script({"chunks": [header + cut]})
    resp = client.post("/v1/chat/completions", json={"model": fh.MODEL_NAME, "max_tokens": 50,
                                                     "messages": [{"role": "user", "content": "go"}]})
    assert resp.status_code == 200
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == enc.decode(cut).rstrip("\ufffd")


def test_tool_call_cut_by_length(env):
    router, frontend, enc, client = env
    router.reset()
    ids = fh.harmony_ids(enc, CALL)
    header = len(fh.harmony_ids(enc, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"))
    router.script({"chunks": [ids]})
    resp = client.post("/v1/chat/completions", json={**body(Case("x", ""), False), "max_tokens": header + 2})
    assert resp.status_code == 200
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["arguments"] == enc.decode(ids[header:header + 2])
