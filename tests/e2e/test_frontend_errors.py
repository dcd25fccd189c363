"""Every 4xx of the frontend with its status and message, router failures mapped to HTTP, API
keys, probes, and cancellation downstream when the client goes away. The router is the scripted
router TEST DOUBLE; the frontend takes its API key from DAYZERO_API_KEY."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

import frontend_harness as fh

pytestmark = pytest.mark.e2e

KEY = "sk-test-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frontend-errors")
    vocab = fh.vocab_dir(tmp_path_factory.getbasetemp())
    router = fh.start_scripted_router()
    with (fh.frontend_for(router, tmp, vocab, env={"DAYZERO_API_KEY": KEY}) as frontend,
          httpx.Client(base_url=frontend.base_url, headers=AUTH, timeout=30) as client):
        yield router, frontend, fh.harmony_encoding(vocab), client


@pytest.fixture
def e(env):
    env[0].reset()
    return env


def chat(**kw) -> dict:
    return {"model": fh.MODEL_NAME, "messages": USER, **kw}


def answer(enc, text: str = "fine") -> dict:
    return {"chunks": [fh.harmony_ids(enc, f"<|channel|>final<|message|>{text}<|return|>")]}


BAD_REQUESTS = [
    # (name, path, body, status, message fragment)
    ("invalid_json", "/v1/chat/completions", b'{"model": "x", "messages": [', 400, "Invalid JSON"),
    ("body_not_object", "/v1/chat/completions", [1, 2], 400, "must be a JSON object"),
    ("missing_messages", "/v1/chat/completions", {"model": fh.MODEL_NAME}, 400, "messages: Field required"),
    ("messages_not_list", "/v1/chat/completions", chat(messages="hi"), 400, "messages"),
    ("empty_messages", "/v1/chat/completions", chat(messages=[]), 400, "at least one message"),
    ("bad_role", "/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "x"}]), 400, "'wizard'"),
    ("missing_role", "/v1/chat/completions", chat(messages=[{"content": "x"}]), 400, "messages[0].role: Field required"),
    ("null_user_content", "/v1/chat/completions", chat(messages=[{"role": "user", "content": None}]), 400, "not null"),
    ("image_part", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "unsupported content part type 'image_url'"),
    ("tool_without_id", "/v1/chat/completions", chat(messages=USER + [{"role": "tool", "content": "r"}]), 400,
     "needs tool_call_id"),
    ("tool_unknown_id", "/v1/chat/completions",
     chat(messages=USER + [{"role": "tool", "tool_call_id": "nope", "content": "r"}]), 400,
     "does not match any earlier assistant tool call"),
    ("bad_effort", "/v1/chat/completions", chat(reasoning_effort="extreme"), 400, "reasoning_effort must be one of"),
    ("prompt_too_long", "/v1/chat/completions", chat(messages=[{"role": "user", "content": "word " * 5000}]), 400,
     f"maximum context length is {fh.MAX_MODEL_LEN} tokens"),
    ("max_tokens_zero", "/v1/chat/completions", chat(max_tokens=0), 400, "max_tokens must be at least 1"),
    ("max_completion_tokens_negative", "/v1/chat/completions", chat(max_completion_tokens=-5), 400,
     "max_completion_tokens must be at least 1"),
    ("max_tokens_too_large", "/v1/chat/completions", chat(max_tokens=fh.MAX_MODEL_LEN), 400, "max_tokens is too large"),
    ("tool_type", "/v1/chat/completions", chat(tools=[{"type": "retrieval", "function": {"name": "f"}}]), 400,
     "tools[0].type must be 'function'"),
    ("tool_name", "/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "get weather"}}]), 400,
     "tools[0].function.name 'get weather'"),
    ("tool_params_not_object", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]), 400,
     "JSON Schema of type 'object'"),
    ("tool_params_not_dict", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), 400,
     "tools[0].function.parameters"),
    ("tool_missing_function", "/v1/chat/completions", chat(tools=[{"type": "function"}]), 400,
     "tools[0].function: Field required"),
    ("tool_duplicate", "/v1/chat/completions", chat(tools=[TOOL, TOOL]), 400, "declared twice"),
    ("tool_choice_required_without_tools", "/v1/chat/completions", chat(tool_choice="required"), 400,
     "needs at least one tool"),
    ("tool_choice_named_unknown", "/v1/chat/completions",
     chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_time"}}), 400,
     "which is not in tools"),
    ("tool_choice_unknown", "/v1/chat/completions", chat(tools=[TOOL], tool_choice="sometimes"), 400,
     "tool_choice must be"),
    ("response_format_type", "/v1/chat/completions", chat(response_format={"type": "xml"}), 400,
     "response_format.type must be"),
    ("response_format_schema_invalid", "/v1/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "nonsense"}}}), 400,
     "schema is not supported"),
    ("response_format_schema_no_name", "/v1/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}), 400,
     "must be an object with a 'name'"),
    ("response_format_with_tools", "/v1/chat/completions",
     chat(tools=[TOOL], response_format={"type": "json_object"}), 400, "together with tools"),
    ("temperature", "/v1/chat/completions", chat(temperature=3), 400, "temperature must be between 0.0 and 2.0"),
    ("top_p", "/v1/chat/completions", chat(top_p=1.5), 400, "top_p must be between"),
    ("n_zero", "/v1/chat/completions", chat(n=0), 400, "n must be between 1"),
    ("top_logprobs", "/v1/chat/completions", chat(logprobs=True, top_logprobs=30), 400, "top_logprobs must be between"),
    ("top_logprobs_without_logprobs", "/v1/chat/completions", chat(top_logprobs=2), 400, "requires logprobs"),
    ("too_many_stops", "/v1/chat/completions", chat(stop=["a", "b", "c", "d", "e"]), 400, "at most 4"),
    ("presence_penalty", "/v1/chat/completions", chat(presence_penalty=2.5), 400,
     "presence_penalty must be between -2.0 and 2.0"),
    ("frequency_penalty", "/v1/chat/completions", chat(frequency_penalty=-3), 400,
     "frequency_penalty must be between -2.0 and 2.0"),
    ("logit_bias_key", "/v1/chat/completions", chat(logit_bias={"abc": 1}), 400, "logit_bias keys must be token ids"),
    ("logit_bias_negative_key", "/v1/chat/completions", chat(logit_bias={"-4": 1}), 400,
     "logit_bias keys must be token ids"),
    ("logit_bias_value", "/v1/chat/completions", chat(logit_bias={"17": 101}), 400,
     "logit_bias values must be between -100 and 100"),
    ("unknown_model", "/v1/chat/completions", chat(model="gpt-5"), 404, "`gpt-5` does not exist"),
    ("completion_empty_prompt", "/v1/completions", {"model": fh.MODEL_NAME, "prompt": ""}, 400,
     "prompt must not be empty"),
    ("completion_token_out_of_vocab", "/v1/completions", {"model": fh.MODEL_NAME, "prompt": [1, 10**7]}, 400,
     "outside the vocabulary"),
    ("completion_echo", "/v1/completions", {"model": fh.MODEL_NAME, "prompt": "x", "echo": True}, 400,
     "echo, best_of and suffix are not supported"),
    ("completion_too_long", "/v1/completions", {"model": fh.MODEL_NAME, "prompt": "word " * 5000}, 400,
     "maximum context length"),
    ("no_such_route", "/v1/embeddings", {"input": "x"}, 404, "Not Found"),
]


@pytest.mark.parametrize("name, path, payload, status, fragment", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request(e, name, path, payload, status, fragment):
    router, _, _, client = e
    if isinstance(payload, bytes):
        resp = client.post(path, content=payload, headers={"Content-Type": "application/json"})
    else:
        resp = client.post(path, json=payload)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert fragment in err["message"], err
    assert err["type"] in ("invalid_request_error", "not_found_error")
    assert router.requests() == []  # nothing reached the router


def test_bad_request_through_the_openai_client(e):
    _, frontend, _, _ = e
    with openai.OpenAI(base_url=f"{frontend.base_url}/v1", api_key=KEY, max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=fh.MODEL_NAME, messages=USER, reasoning_effort="extreme")
    assert info.value.status_code == 400 and "reasoning_effort" in info.value.message


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}],
                         ids=["missing", "wrong", "no-bearer"])
@pytest.mark.parametrize("method, path", [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                                          ("GET", "/v1/models")])
def test_api_key_required(e, headers, method, path):
    _, frontend, _, _ = e
    resp = httpx.request(method, f"{frontend.base_url}{path}", json=chat(), headers=headers, timeout=10)
    assert resp.status_code == 401
    assert "API key" in resp.json()["error"]["message"]


def test_api_key_through_the_openai_client(e):
    router, frontend, enc, _ = e
    with openai.OpenAI(base_url=f"{frontend.base_url}/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model=fh.MODEL_NAME, messages=USER)
    router.script(answer(enc, "authorized"))
    with openai.OpenAI(base_url=f"{frontend.base_url}/v1", api_key=KEY, max_retries=0) as client:
        resp = client.chat.completions.create(model=fh.MODEL_NAME, messages=USER)
    assert resp.choices[0].message.content == "authorized"


def test_api_key_flag():
    from dayzero_frontend.__main__ import build_parser

    args = build_parser().parse_args(["--router", "r:1", "--api-key", "k1"])
    assert args.api_key == "k1"


GRPC_ERRORS = [("RESOURCE_EXHAUSTED", 503), ("UNAVAILABLE", 503), ("DEADLINE_EXCEEDED", 504),
               ("INVALID_ARGUMENT", 400), ("INTERNAL", 502)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("code, status", GRPC_ERRORS, ids=[g[0] for g in GRPC_ERRORS])
def test_router_errors_map_to_http(e, code, status, stream):
    router, _, _, client = e
    message = f"scripted {code.lower()} failure"
    router.script({"error": {"code": code, "message": message}})
    resp = client.post("/v1/chat/completions", json=chat(stream=stream))
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert message in err["message"] and err["code"] == code.lower()


def test_abort_finish_is_503(e):
    router, _, enc, client = e
    router.script({"chunks": [fh.harmony_ids(enc, "<|channel|>final<|message|>partial")], "finish": "abort"})
    resp = client.post("/v1/chat/completions", json=chat())
    assert resp.status_code == 503 and "aborted" in resp.json()["error"]["message"]


def test_failure_mid_stream_ends_with_an_error_event(e):
    router, frontend, enc, client = e
    ids = fh.harmony_ids(enc, "<|channel|>final<|message|>This will break")
    router.script({"chunks": [ids[:3], ids[3:]], "error": {"code": "UNAVAILABLE", "message": "decode worker died",
                                                          "after_chunks": 1}})
    with client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as resp:
        assert resp.status_code == 200
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "decode worker died" in json.loads(events[-2])["error"]["message"]
    router.script({"chunks": [ids[:3], ids[3:]], "error": {"code": "UNAVAILABLE", "message": "decode worker died",
                                                          "after_chunks": 1}})
    with openai.OpenAI(base_url=f"{frontend.base_url}/v1", api_key=KEY, max_retries=0) as oc:
        with pytest.raises(openai.APIError, match="decode worker died"):
            for _ in oc.chat.completions.create(model=fh.MODEL_NAME, messages=USER, stream=True):
                pass


def test_stream_disconnect_cancels_downstream(e):
    router, _, enc, client = e
    router.script({"chunks": [fh.harmony_ids(enc, "<|channel|>final<|message|>start")], "hang": True})
    with client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    records = router.wait_for(lambda rs: rs and rs[-1]["done"])
    assert records[-1]["cancelled"] is True


def test_non_stream_disconnect_cancels_downstream(e):
    router, frontend, enc, _ = e
    router.script({"chunks": [fh.harmony_ids(enc, "<|channel|>final<|message|>start")], "hang": True})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{frontend.base_url}/v1/chat/completions", json=chat(), headers=AUTH, timeout=1.0)
    records = router.wait_for(lambda rs: rs and rs[-1]["done"])
    assert records[-1]["cancelled"] is True


def test_stop_after_stop_string_cancels_downstream(e):
    router, _, enc, client = e
    router.script({"chunks": [fh.harmony_ids(enc, "<|channel|>final<|message|>alpha beta STOP gamma")], "hang": True})
    resp = client.post("/v1/chat/completions", json=chat(stop=["STOP"]))
    choice = resp.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("alpha beta ", "stop")
    assert router.wait_for(lambda rs: rs and rs[-1]["done"])[-1]["cancelled"] is True


def test_probes_and_metrics(e):
    router, frontend, enc, client = e
    assert httpx.get(f"{frontend.base_url}/health").status_code == 200
    ready = httpx.get(f"{frontend.base_url}/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    router.script(answer(enc))
    assert client.post("/v1/chat/completions", json=chat()).status_code == 200
    text = httpx.get(f"{frontend.base_url}/metrics").text
    assert 'dayzero_frontend_requests_total{endpoint="chat",status="200"}' in text
    assert 'dayzero_frontend_requests_total{endpoint="chat",status="400"}' in text
    assert "dayzero_frontend_time_to_first_token_seconds_count" in text
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == fh.MODEL_NAME and models["data"][0]["max_model_len"] == fh.MAX_MODEL_LEN


def test_ready_is_503_without_a_router(tmp_path, tmp_path_factory):
    vocab = fh.vocab_dir(tmp_path_factory.getbasetemp())
    frontend = fh.start_frontend(f"127.0.0.1:{fh.free_port()}", tmp_path, vocab)
    try:
        ready = httpx.get(f"{frontend.base_url}/ready", timeout=10)
        assert ready.status_code == 503 and ready.json()["ready"] is False
        resp = httpx.post(f"{frontend.base_url}/v1/chat/completions", json=chat(), timeout=30)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable"
    finally:
        frontend.stop()


def test_disconnect_before_the_first_token_cancels_downstream(e):
    router, frontend, _, _ = e
    router.script({"chunks": [], "hang": True})  # the router never sends a first message
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{frontend.base_url}/v1/chat/completions", json=chat(stream=True), headers=AUTH, timeout=1.0)
    records = router.wait_for(lambda rs: rs and rs[-1]["done"])
    assert records[-1]["cancelled"] is True
