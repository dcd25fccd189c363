"""POST /v1/completions: a raw prompt (text or token ids, no chat format) -> text."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from dayzero.rpc.v1 import common_pb2, router_pb2

from dayzero_frontend.choices import FINISHED, Step, StopMatcher
from dayzero_frontend.errors import APIError, bad_request
from dayzero_frontend.harmony import HarmonyChat
from dayzero_frontend.harmony_events import ContentDelta
from dayzero_frontend.openai_protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest,
                                              CompletionResponse, Usage)
from dayzero_frontend.router_client import RouterStream
from dayzero_frontend.serving import FirstToken, collect, prime, stream_sse
from dayzero_frontend.state import FrontendState
from dayzero_frontend.streaming import sse
from dayzero_frontend.validation import check_model, check_ranges, logprob_settings, max_new_tokens, sampling_params, stop_strings

MAX_PENDING = 4  # tokens held back while they decode to an incomplete UTF-8 character


@dataclass
class TextChoiceRun:
    """Decodes one Generate stream to text, holding back partial UTF-8 and stop-string prefixes."""

    stream: RouterStream
    chat: HarmonyChat
    stops: StopMatcher
    skip_special: bool
    completion_tokens: int = 0
    pending: list[int] = field(default_factory=list)

    async def steps(self) -> AsyncIterator[Step]:
        try:
            while True:
                msg = await self.stream.next()
                if msg is None:
                    yield self._finish(Step(), "stop")
                    return
                if msg.finish_reason == common_pb2.FINISH_REASON_ABORT:
                    raise APIError(503, "router: the request was aborted downstream", code="aborted")
                step = Step(token_ids=list(msg.token_ids), logprobs=list(msg.logprobs))
                self.completion_tokens += len(step.token_ids)
                hit = self._push(step, [t for t in msg.token_ids if self._visible(t)])
                if hit or msg.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                    yield self._finish(step, "stop" if hit else FINISHED.get(msg.finish_reason, "stop"), hit)
                    return
                yield step
        finally:
            self.stream.cancel()

    def _visible(self, token: int) -> bool:
        if not 0 <= token < self.chat.vocab_size:
            return False
        return not (self.skip_special and self.chat.enc.is_special_token(token))

    def _push(self, step: Step, tokens: list[int]) -> bool:
        self.pending.extend(tokens)
        text = self.chat.decode(self.pending)
        if text.endswith("\ufffd") and len(self.pending) < MAX_PENDING:
            return False
        self.pending = []
        out, hit = self.stops.push(text)
        if out:
            step.events.append(ContentDelta(out))
        return hit

    def _finish(self, step: Step, reason: str, hit: bool = False) -> Step:
        if not hit:
            tail = self.stops.push(self.chat.decode(self.pending))[0] if self.pending else ""
            tail += self.stops.flush()
            if tail:
                step.events.append(ContentDelta(tail))
        step.finish_reason = reason
        return step


def prompts_of(req: CompletionRequest, state: FrontendState) -> list[list[int]]:
    p = req.prompt
    if isinstance(p, str):
        items: list = [p]
    elif p and all(isinstance(x, int) for x in p):
        items = [p]
    else:
        items = list(p)
    if not items:
        raise bad_request("prompt must not be empty", param="prompt")
    out = []
    for item in items:
        ids = state.chat.encode_prompt_text(item) if isinstance(item, str) else list(item)
        if not ids:
            raise bad_request("prompt must not be empty", param="prompt")
        if any(t < 0 or t >= state.chat.vocab_size for t in ids):
            raise bad_request(f"prompt contains token ids outside the vocabulary [0, {state.chat.vocab_size})",
                              param="prompt")
        out.append(ids)
    return out


def text_logprobs(chat: HarmonyChat, steps: list[Step]) -> CompletionLogprobs:
    out, offset = CompletionLogprobs(), 0
    for step in steps:
        for e in step.logprobs:
            token = chat.decode([e.token_id])
            out.tokens.append(token)
            out.token_logprobs.append(e.logprob)
            out.top_logprobs.append({chat.decode([t.token_id]): t.logprob for t in e.top})
            out.text_offset.append(offset)
            offset += len(token)
    return out


async def completions(state: FrontendState, request: Request, req: CompletionRequest) -> Response:
    started = time.monotonic()
    check_model(req.model, state.limits)
    check_ranges(req)
    if req.echo or (req.best_of or 1) > 1 or req.suffix:
        raise bad_request("echo, best_of and suffix are not supported", param="echo" if req.echo else None)
    stops = stop_strings(req.stop)
    want_logprobs, top = logprob_settings(req)
    prompts = prompts_of(req, state)
    request_id = "cmpl-" + secrets.token_hex(12)
    runs: list[TextChoiceRun] = []
    budgets = [max_new_tokens(req.max_tokens if req.max_tokens is not None else 16, len(p), state.limits,
                              "max_tokens") for p in prompts]
    for k, (prompt, budget) in enumerate(zip(prompts, budgets)):
        for j in range(req.n):
            index = k * req.n + j
            sampling = sampling_params(req, budget, state.chat.completion_stop_ids, j, want_logprobs, top)
            stream = state.router.open(router_pb2.GenerateRequest(
                request_id=f"{request_id}-{index}", prompt_token_ids=prompt, sampling=sampling))
            runs.append(TextChoiceRun(stream, state.chat, StopMatcher(stops), req.skip_special_tokens))
    prompt_tokens = sum(len(p) for p in prompts)
    state.metrics.prompt_tokens.inc(prompt_tokens)
    first_token = FirstToken(state.metrics, started, "completions")

    def usage() -> Usage:
        done = sum(r.completion_tokens for r in runs)
        return Usage(prompt_tokens=prompt_tokens, completion_tokens=done, total_tokens=prompt_tokens + done)

    def finished() -> None:
        state.metrics.completion_tokens.inc(sum(r.completion_tokens for r in runs))
        state.metrics.latency.labels(endpoint="completions").observe(time.monotonic() - started)

    def choice(index: int, step: Step, text: str | None = None) -> CompletionChoice:
        lp = text_logprobs(state.chat, [step]) if want_logprobs else None
        text = "".join(e.text for e in step.events) if text is None else text
        return CompletionChoice(index=index, text=text, finish_reason=step.finish_reason, logprobs=lp)

    if not req.stream:
        steps: list[list[Step]] = [[] for _ in runs]
        try:
            if not await collect(request, [r.steps() for r in runs], lambda i, s: (first_token.seen(s),
                                                                                   steps[i].append(s)), state.metrics):
                return Response(status_code=499)
        finally:
            finished()
        choices = []
        for i, ss in enumerate(steps):
            merged = Step(events=[e for s in ss for e in s.events], logprobs=[e for s in ss for e in s.logprobs],
                          finish_reason=ss[-1].finish_reason if ss else "stop")
            choices.append(choice(i, merged))
        body = CompletionResponse(id=request_id, model=state.limits.model_name, choices=choices, usage=usage())
        return JSONResponse(body.model_dump())

    primed = await prime(request, [r.steps() for r in runs], state.metrics)
    if primed is None:
        finished()
        return Response(status_code=499)
    created = int(time.time())
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def on_step(index: int, step: Step) -> list[str]:
        first_token.seen(step)
        return [sse(CompletionResponse(id=request_id, model=state.limits.model_name, created=created,
                                       choices=[choice(index, step)]))]

    def finale() -> list[str]:
        if not include_usage:
            return []
        return [sse(CompletionResponse(id=request_id, model=state.limits.model_name, created=created, choices=[],
                                       usage=usage()))]

    async def body():
        try:
            async for line in stream_sse(request, primed, [], on_step, finale, state.metrics, request_id):
                yield line
        finally:
            finished()

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
