"""One choice of a request: a router stream driven through a parser, step by step.

A *step* is what one downstream ``GenerateResponse`` produced: parsed events, the tokens' logprobs
and, on the last step, the finish reason. Streaming turns steps into SSE chunks, non-streaming
accumulates them; both see the same steps, so both give the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator

from dayzero.rpc.v1 import common_pb2

from dayzero_frontend.errors import APIError
from dayzero_frontend.harmony_events import ContentDelta, Event
from dayzero_frontend.harmony_parser import ChoiceParser
from dayzero_frontend.router_client import RouterStream

FINISHED = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length"}


class StopMatcher:
    """Finds stop strings in streamed text, holding back a possible prefix of one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.keep = max((len(s) for s in stops), default=1) - 1
        self.pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was hit (text then ends before it)."""
        if not self.stops:
            return text, False
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[:min(hits)], ""
            return out, True
        cut = max(len(self.pending) - self.keep, 0)
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


@dataclass
class Step:
    events: list[Event] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class ChatChoiceRun:
    """Drives one Generate stream through a Harmony ChoiceParser."""

    index: int
    stream: RouterStream
    parser: ChoiceParser
    stops: StopMatcher
    completion_tokens: int = 0
    first_token: bool = False
    prefix: list[int] = field(default_factory=list)  # tokens the frontend wrote into the prompt's open
    #                                                  header (a forced tool call): parsed, not counted

    async def steps(self) -> AsyncIterator[Step]:
        pending: list[Event] = [e for tok in self.prefix for e in self.parser.feed(tok)]
        try:
            while True:
                msg = await self.stream.next()
                step = Step(events=pending)
                pending = []
                if msg is None:  # the stream closed without a finish reason
                    self.parser.anomalies.append("missing_finish_reason")
                    yield self._finish(step, "stop")
                    return
                if msg.finish_reason == common_pb2.FINISH_REASON_ABORT:
                    raise APIError(503, "router: the request was aborted downstream", code="aborted")
                stop_hit = self._consume(msg, step)
                if self.parser.done or stop_hit or msg.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                    reason = "stop" if (self.parser.done or stop_hit) else FINISHED.get(msg.finish_reason, "stop")
                    yield self._finish(step, reason, stop_hit)
                    return
                yield step
        finally:
            self.stream.cancel()

    def _consume(self, msg, step: Step) -> bool:
        logprobs = list(msg.logprobs)
        for i, tok in enumerate(msg.token_ids):
            if self.parser.done:
                self.parser.feed(tok)  # only counted as an anomaly
                continue
            self.completion_tokens += 1
            step.token_ids.append(tok)
            if i < len(logprobs):
                step.logprobs.append(logprobs[i])
            for event in self.parser.feed(tok):
                if self._add(step, event):
                    return True
        return False

    def _add(self, step: Step, event: Event) -> bool:
        if not isinstance(event, ContentDelta):
            step.events.append(event)
            return False
        text, hit = self.stops.push(event.text)
        if text:
            step.events.append(ContentDelta(text))
        return hit

    def _finish(self, step: Step, reason: str, stopped_by_string: bool = False) -> Step:
        events = self.parser.finish()  # always: it records what was left unfinished
        for event in [] if stopped_by_string else events:
            if self._add(step, event):
                stopped_by_string = True
                break
        if not stopped_by_string and (tail := self.stops.flush()):
            step.events.append(ContentDelta(tail))
        if reason == "stop" and self.parser.tool_calls and not stopped_by_string:
            reason = "tool_calls"
        step.finish_reason = reason
        return step
