"""Chat steps -> OpenAI responses: SSE chunks when streaming, one message otherwise.

Also the plumbing both paths share: merging the steps of ``n`` choices (``fan_in``) and noticing a
client that went away (``wait_for_disconnect``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator

from pydantic import BaseModel
from starlette.requests import Request

from dayzero.rpc.v1 import common_pb2

from dayzero_frontend.choices import Step
from dayzero_frontend.harmony import HarmonyChat
from dayzero_frontend.harmony_events import ContentDelta, Event, ReasoningDelta, ToolCallBegin, ToolCallDelta
from dayzero_frontend.openai_protocol import (AssistantMessageOut, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                              ChatDelta, ChoiceLogprobs, FunctionCallOut, FunctionDeltaOut,
                                              TokenLogprobOut, ToolCallDeltaOut, ToolCallOut, TopLogprobOut, Usage)

DONE = "data: [DONE]\n\n"


def sse(obj: BaseModel) -> str:
    return f"data: {obj.model_dump_json()}\n\n"


async def fan_in(streams: list[AsyncIterator[Step]]) -> AsyncIterator[tuple[int, Step]]:
    """Steps of several choices as they come; the first failure is raised, the rest cancelled."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, steps: AsyncIterator[Step]) -> None:
        try:
            async for step in steps:
                await queue.put((index, step, None))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((index, None, e))
        finally:
            await queue.put((index, None, StopAsyncIteration()))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    live = len(tasks)
    try:
        while live:
            index, step, err = await queue.get()
            if isinstance(err, StopAsyncIteration):
                live -= 1
            elif err is not None:
                raise err
            else:
                yield index, step
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the request body must be read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def logprob_entries(chat: HarmonyChat, entries: list[common_pb2.TokenLogprob]) -> list[TokenLogprobOut]:
    def one(token_id: int, logprob: float) -> TopLogprobOut:
        text = chat.decode([token_id])
        return TopLogprobOut(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

    out = []
    for e in entries:
        head = one(e.token_id, e.logprob)
        out.append(TokenLogprobOut(**head.model_dump(), top_logprobs=[one(t.token_id, t.logprob) for t in e.top]))
    return out


def event_deltas(events: list[Event]) -> list[ChatDelta]:
    """Events -> deltas, merging neighbours of the same kind."""
    out: list[ChatDelta] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, ContentDelta):
            if last is not None and last.content is not None:
                last.content += e.text
            else:
                out.append(ChatDelta(content=e.text))
        elif isinstance(e, ReasoningDelta):
            if last is not None and last.reasoning is not None:
                last.reasoning += e.text
                last.reasoning_content = last.reasoning
            else:
                out.append(ChatDelta(reasoning=e.text, reasoning_content=e.text))
        elif isinstance(e, ToolCallBegin):
            out.append(ChatDelta(tool_calls=[ToolCallDeltaOut(
                index=e.index, id=e.call_id, type="function", function=FunctionDeltaOut(name=e.name, arguments=""))]))
        elif isinstance(e, ToolCallDelta):
            call = last.tool_calls[0] if last is not None and last.tool_calls else None
            if call is not None and call.index == e.index and call.id is None:
                call.function.arguments += e.arguments
            else:
                out.append(ChatDelta(tool_calls=[ToolCallDeltaOut(
                    index=e.index, function=FunctionDeltaOut(arguments=e.arguments))]))
    return out


@dataclass
class ChatChunks:
    """Builds the SSE chunks of one streamed chat completion."""

    chat: HarmonyChat
    request_id: str
    model: str
    created: int
    include_usage: bool
    want_logprobs: bool

    def chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> str:
        return sse(ChatCompletionChunk(id=self.request_id, model=self.model, created=self.created,
                                       choices=choices, usage=usage))

    def opening(self, index: int) -> str:
        return self.chunk([ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))])

    def step(self, index: int, step: Step) -> list[str]:
        logprobs = None
        if self.want_logprobs and step.logprobs:
            logprobs = ChoiceLogprobs(content=logprob_entries(self.chat, step.logprobs))
        deltas = event_deltas(step.events)
        if step.finish_reason is not None or (not deltas and logprobs is not None):
            deltas.append(ChatDelta())
        out = []
        for i, delta in enumerate(deltas):
            last = i == len(deltas) - 1
            out.append(self.chunk([ChatChunkChoice(
                index=index, delta=delta, logprobs=logprobs if i == 0 else None,
                finish_reason=step.finish_reason if last else None)]))
        return out

    def usage(self, usage: Usage) -> str:
        return self.chunk([], usage=usage)


@dataclass
class ChatAccumulator:
    """Collects one choice's steps into a non-streamed chat choice."""

    content: str = ""
    reasoning: str = ""
    calls: list[list[str]] = field(default_factory=list)  # [id, name, arguments]
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)
    finish_reason: str = "stop"

    def add(self, step: Step) -> None:
        for e in step.events:
            if isinstance(e, ContentDelta):
                self.content += e.text
            elif isinstance(e, ReasoningDelta):
                self.reasoning += e.text
            elif isinstance(e, ToolCallBegin):
                self.calls.append([e.call_id, e.name, ""])
            elif isinstance(e, ToolCallDelta):
                self.calls[e.index][2] += e.arguments
        self.logprobs.extend(step.logprobs)
        if step.finish_reason is not None:
            self.finish_reason = step.finish_reason

    def choice(self, index: int, chat: HarmonyChat, want_logprobs: bool) -> ChatChoice:
        calls = [ToolCallOut(id=i, function=FunctionCallOut(name=n, arguments=a)) for i, n, a in self.calls]
        message = AssistantMessageOut(
            content=self.content if (self.content or not calls) else None,
            reasoning=self.reasoning or None, reasoning_content=self.reasoning or None, tool_calls=calls)
        logprobs = ChoiceLogprobs(content=logprob_entries(chat, self.logprobs)) if want_logprobs else None
        return ChatChoice(index=index, message=message, finish_reason=self.finish_reason, logprobs=logprobs)
