"""Checks of request fields that need a clear 400, and the downstream SamplingParams they become."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dayzero.json_grammar import GrammarError, GrammarUnavailable, json_grammar
from dayzero.rpc.v1 import common_pb2

from dayzero_frontend.errors import APIError, bad_request
from dayzero_frontend.openai_protocol import (ChatCompletionRequest, CompletionRequest, ContentPart, FunctionDef,
                                              NamedToolChoice, SamplingFields)

TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4
SEED_MASK = (1 << 64) - 1


@dataclass
class Limits:
    model_name: str
    max_model_len: int


def check_model(requested: str | None, limits: Limits) -> None:
    if requested and requested != limits.model_name:
        raise APIError(404, f"The model `{requested}` does not exist; this server serves `{limits.model_name}`.",
                       param="model", code="model_not_found")


def content_text(content: str | list[ContentPart] | None, where: str, allow_null: bool) -> str:
    """A message's text: a string, a list of text parts (joined), empty, or null where allowed."""
    if content is None:
        if not allow_null:
            raise bad_request(f"{where}.content must be a string or a list of text parts, not null",
                              param=f"{where}.content")
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(f"{where}.content[{j}]: unsupported content part type {part.type!r}"
                              " (only text parts are supported)", param=f"{where}.content")
        texts.append(part.text)
    return "".join(texts)


def check_tools(req: ChatCompletionRequest) -> list[FunctionDef]:
    """The function tools to render (none when tool_choice is "none")."""
    tools = req.tools or []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise bad_request(f"tools[{i}].type must be 'function', got {tool.type!r}", param=f"tools[{i}].type")
        name = tool.function.name
        if not TOOL_NAME_RE.match(name):
            raise bad_request(f"tools[{i}].function.name {name!r} must be 1-64 characters of a-z, A-Z, 0-9, _ or -",
                              param=f"tools[{i}].function.name")
        if name in names:
            raise bad_request(f"tools[{i}].function.name {name!r} is declared twice", param="tools")
        names.add(name)
        params = tool.function.parameters
        if params is not None and params.get("type", "object") != "object":
            raise bad_request(f"tools[{i}].function.parameters must be a JSON Schema of type 'object'",
                              param=f"tools[{i}].function.parameters")
    check_tool_choice(req, names)
    return [] if req.tool_choice == "none" else [t.function for t in tools]


def response_schema(req: ChatCompletionRequest, tools: list[FunctionDef]) -> str | None:
    """JSON Schema text the answer must satisfy (``response_format`` json_object / json_schema), or None.
    The schema is compiled here (llguidance, no vocabulary needed) so a bad one is a 400 at once."""
    rf = req.response_format
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type", "text"), str):
        raise bad_request("response_format must be an object with a 'type'", param="response_format")
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema: object = {"type": "object"}
    elif kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not TOOL_NAME_RE.match(spec["name"]):
            raise bad_request("response_format.json_schema must be an object with a 'name' of 1-64 characters of "
                              "a-z, A-Z, 0-9, _ or -", param="response_format.json_schema")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON Schema object",
                              param="response_format.json_schema.schema")
    else:
        raise bad_request(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                          param="response_format.type")
    if tools:
        raise bad_request("response_format json together with tools the model may call is not supported; "
                          "set tool_choice to 'none' or drop response_format", param="response_format")
    text = json.dumps(schema)
    try:
        json_grammar(text)
    except GrammarUnavailable as e:
        raise APIError(501, str(e), param="response_format") from None
    except GrammarError as e:
        raise bad_request(f"response_format schema is not supported: {e}", param="response_format") from None
    return text


def tool_args_schema(tools: list[FunctionDef], name: str) -> str | None:
    """The JSON Schema the arguments of a forced call of ``name`` are held to: its ``parameters`` (an
    empty object when it has none); None (arguments unconstrained, as before) if llguidance cannot
    compile them or is not installed."""
    (fn,) = [t for t in tools if t.name == name]
    text = json.dumps(fn.parameters if fn.parameters is not None else {"type": "object", "properties": {}})
    try:
        json_grammar(text)
    except GrammarError:  # GrammarUnavailable included
        return None
    return text


def check_tool_choice(req: ChatCompletionRequest, names: set[str]) -> None:
    choice = req.tool_choice
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise bad_request(f"tool_choice names {choice.function.name!r}, which is not in tools", param="tool_choice")
        return
    if choice not in (None, "auto", "none", "required"):
        raise bad_request(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}",
                          param="tool_choice")
    if choice == "required" and not names:
        raise bad_request("tool_choice 'required' needs at least one tool in tools", param="tool_choice")


def forced_tool(req: ChatCompletionRequest, tools: list[FunctionDef]) -> str | None:
    """The function the answer must call: a named tool_choice, or 'required' with a single tool.
    The frontend then writes that call's Harmony header itself and the model writes the arguments.
    ('required' with several tools constrains the output to start with one of their call headers,
    and the arguments after it to that tool's parameters schema.)"""
    choice = req.tool_choice
    if isinstance(choice, NamedToolChoice):
        return choice.function.name
    if choice == "required" and len(tools) == 1:
        return tools[0].name
    return None


def stop_strings(stop: str | list[str] | None) -> list[str]:
    items = [stop] if isinstance(stop, str) else list(stop or [])
    if len(items) > MAX_STOP_STRINGS:
        raise bad_request(f"stop: at most {MAX_STOP_STRINGS} sequences are allowed", param="stop")
    if any(not s for s in items):
        raise bad_request("stop: sequences must not be empty", param="stop")
    return items


def check_ranges(req: SamplingFields) -> None:
    def out_of(name, value, lo, hi):
        if value is not None and not (lo <= value <= hi):
            raise bad_request(f"{name} must be between {lo} and {hi}, got {value}", param=name)

    out_of("temperature", req.temperature, 0.0, 2.0)
    out_of("top_p", req.top_p, 0.0, 1.0)
    out_of("min_p", req.min_p, 0.0, 1.0)
    out_of("n", req.n, 1, MAX_N)
    if req.top_k is not None and req.top_k < -1:
        raise bad_request(f"top_k must be -1 (off) or >= 0, got {req.top_k}", param="top_k")
    out_of("frequency_penalty", req.frequency_penalty, -2.0, 2.0)
    out_of("presence_penalty", req.presence_penalty, -2.0, 2.0)
    logit_bias(req)


def logit_bias(req: SamplingFields) -> dict[int, float]:
    """``logit_bias`` as {token id: bias}: keys are token ids written as strings, biases in [-100, 100]."""
    out: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        if token < 0 or str(key).strip() != str(token):
            raise bad_request(f"logit_bias keys must be token ids (non-negative integers), got {key!r}",
                              param="logit_bias")
        if not -100 <= value <= 100:
            raise bad_request(f"logit_bias values must be between -100 and 100, got {value} for token {token}",
                              param="logit_bias")
        out[token] = float(value)
    return out


def max_new_tokens(requested: int | None, prompt_len: int, limits: Limits, param: str) -> int:
    """The token budget of each choice, or a 400 when the prompt or the request does not fit."""
    if prompt_len >= limits.max_model_len:
        raise bad_request(f"This model's maximum context length is {limits.max_model_len} tokens. However, your"
                          f" prompt is {prompt_len} tokens, which leaves no room to generate.",
                          param="messages", code="context_length_exceeded")
    room = limits.max_model_len - prompt_len
    if requested is None:
        return room
    if requested < 1:
        raise bad_request(f"{param} must be at least 1, got {requested}", param=param)
    if requested > room:
        raise bad_request(f"{param} is too large: {requested}. This model's maximum context length is"
                          f" {limits.max_model_len} tokens and your prompt is {prompt_len} tokens, so at most"
                          f" {room} can be generated.", param=param, code="context_length_exceeded")
    return requested


def sampling_params(req: SamplingFields, max_tokens: int, stop_ids: list[int], index: int,
                    logprobs: bool, top_logprobs: int,
                    allowed_prefixes: list[list[int]] | None = None,
                    json_schema: str | None = None, json_end_ids: list[int] | None = None,
                    prefix_json_schemas: list[str] | None = None) -> common_pb2.SamplingParams:
    """Downstream sampling parameters of choice ``index`` (seeds are offset per choice)."""
    params = common_pb2.SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=req.top_p if req.top_p is not None else 1.0,
        top_k=max(req.top_k or 0, 0),
        min_p=req.min_p or 0.0,
        max_tokens=max_tokens,
        stop_token_ids=sorted(set(stop_ids) | set(req.stop_token_ids or [])),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        ignore_eos=req.ignore_eos,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=logit_bias(req),
        allowed_prefixes=[common_pb2.TokenSequence(token_ids=seq) for seq in allowed_prefixes or []],
        json_schema=json_schema or "",
        json_end_ids=json_end_ids or [],
        prefix_json_schemas=prefix_json_schemas or [],
    )
    if req.seed is not None:
        params.seed = (req.seed + index) & SEED_MASK
    return params


def logprob_settings(req: ChatCompletionRequest | CompletionRequest) -> tuple[bool, int]:
    if isinstance(req, ChatCompletionRequest):
        top = req.top_logprobs or 0
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        wanted = req.logprobs
    else:
        top = req.logprobs or 0
        wanted = req.logprobs is not None
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad_request(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}",
                          param="top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs")
    return wanted, top
