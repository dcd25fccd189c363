"""The official ``openai`` client against a running frontend, in four modes (sync/async x
stream/non-stream), with answers normalized so tests compare one shape across modes."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import openai

MODES = [("sync", False), ("sync", True), ("async", False), ("async", True)]
MODE_IDS = ["sync", "sync-stream", "async", "async-stream"]
FINISH_REASONS = {"stop", "length", "tool_calls"}


@dataclass
class ChoiceOut:
    index: int
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments)
    finish_reason: str | None = None
    logprobs: list = field(default_factory=list)


@dataclass
class Outcome:
    choices: list[ChoiceOut]
    usage: object | None
    chunks: list = field(default_factory=list)


def _from_message(choice) -> ChoiceOut:
    msg = choice.message
    calls = [(c.id, c.function.name, c.function.arguments) for c in (msg.tool_calls or [])]
    lps = list(choice.logprobs.content) if choice.logprobs and choice.logprobs.content else []
    return ChoiceOut(choice.index, msg.content, getattr(msg, "reasoning", None),
                     getattr(msg, "reasoning_content", None), calls, choice.finish_reason, lps)


def _from_chunks(chunks: list) -> Outcome:
    by_index: dict[int, ChoiceOut] = {}
    calls: dict[int, dict[int, list[str]]] = {}
    usage = None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            out = by_index.setdefault(c.index, ChoiceOut(c.index))
            d = c.delta
            if d.content is not None:
                out.content = (out.content or "") + d.content
            for name in ("reasoning", "reasoning_content"):
                piece = getattr(d, name, None)
                if piece is not None:
                    setattr(out, name, (getattr(out, name) or "") + piece)
            for tc in d.tool_calls or []:
                slot = calls.setdefault(c.index, {}).setdefault(tc.index, ["", "", ""])
                if tc.id:
                    slot[0] = tc.id
                if tc.function and tc.function.name:
                    slot[1] = tc.function.name
                if tc.function and tc.function.arguments:
                    slot[2] += tc.function.arguments
            if c.logprobs and c.logprobs.content:
                out.logprobs.extend(c.logprobs.content)
            if c.finish_reason is not None:
                out.finish_reason = c.finish_reason
    for index, slots in calls.items():
        by_index[index].tool_calls = [tuple(slots[i]) for i in sorted(slots)]
    return Outcome([by_index[i] for i in sorted(by_index)], usage, chunks)


def ask_chat(base_url: str, mode: tuple[str, bool], api_key: str = "unused", **kw) -> Outcome:
    """One chat completion through the official client in the given mode."""
    kind, stream = mode
    if stream:
        kw.setdefault("stream_options", {"include_usage": True})
    if kind == "sync":
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0) as client:
            resp = client.chat.completions.create(stream=stream, **kw)
            if stream:
                return _from_chunks(list(resp))
            return Outcome([_from_message(c) for c in resp.choices], resp.usage)

    async def run() -> Outcome:
        async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0) as client:
            resp = await client.chat.completions.create(stream=stream, **kw)
            if stream:
                return _from_chunks([c async for c in resp])
            return Outcome([_from_message(c) for c in resp.choices], resp.usage)

    return asyncio.run(run())


def ask_completion(base_url: str, mode: tuple[str, bool], api_key: str = "unused", **kw) -> tuple[list, object]:
    """A text completion: ([(index, text, finish_reason)], usage)."""
    kind, stream = mode
    if stream:
        kw.setdefault("stream_options", {"include_usage": True})

    def fold(items) -> tuple[list, object]:
        texts: dict[int, list] = {}
        usage = None
        for item in items:
            usage = item.usage or usage
            for c in item.choices:
                slot = texts.setdefault(c.index, [c.index, "", None])
                slot[1] += c.text
                slot[2] = c.finish_reason or slot[2]
        return [tuple(texts[i]) for i in sorted(texts)], usage

    if kind == "sync":
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0) as client:
            resp = client.completions.create(stream=stream, **kw)
            return fold(list(resp) if stream else [resp])

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0) as client:
            resp = await client.completions.create(stream=stream, **kw)
            return fold([c async for c in resp] if stream else [resp])

    return asyncio.run(run())


def check_shape(out: Outcome, n: int, max_tokens: int) -> None:
    """What every answer must look like, whatever the model wrote."""
    assert [c.index for c in out.choices] == list(range(n))
    for c in out.choices:
        assert c.finish_reason in FINISH_REASONS, c
        assert c.content is None or isinstance(c.content, str)
        assert c.reasoning == c.reasoning_content
        if c.finish_reason == "tool_calls":
            assert c.tool_calls, c
        for call_id, name, args in c.tool_calls:
            assert call_id and name and isinstance(args, str)
    u = out.usage
    assert u is not None
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert 0 < u.prompt_tokens and 0 <= u.completion_tokens <= n * max_tokens
    assert 0 <= u.completion_tokens_details.reasoning_tokens <= u.completion_tokens


def is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False
