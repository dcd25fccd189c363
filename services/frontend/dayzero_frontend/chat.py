"""POST /v1/chat/completions: render with Harmony, fan out ``n`` Generate calls, parse back."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import time

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from dayzero.rpc.v1 import router_pb2

from dayzero_frontend.choices import ChatChoiceRun, Step, StopMatcher
from dayzero_frontend.openai_protocol import ChatCompletionRequest, ChatCompletionResponse, CompletionTokensDetails, Usage
from dayzero_frontend.serving import FirstToken, collect, prime, stream_sse
from dayzero_frontend.state import FrontendState
from dayzero_frontend.streaming import ChatAccumulator, ChatChunks
from dayzero_frontend.validation import (check_model, check_ranges, check_tools, forced_tool, logprob_settings,
                                         max_new_tokens, response_schema, sampling_params, stop_strings,
                                         tool_args_schema)


log = logging.getLogger("dayzero.frontend")


def chat_usage(prompt_len: int, runs: list[ChatChoiceRun]) -> Usage:
    completion = sum(r.completion_tokens for r in runs)
    return Usage(prompt_tokens=prompt_len, completion_tokens=completion, total_tokens=prompt_len + completion,
                 completion_tokens_details=CompletionTokensDetails(
                     reasoning_tokens=sum(r.parser.reasoning_tokens for r in runs)))


async def chat_completions(state: FrontendState, request: Request, req: ChatCompletionRequest) -> Response:
    started = time.monotonic()
    check_model(req.model, state.limits)
    check_ranges(req)
    tools = check_tools(req)
    stops = stop_strings(req.stop)
    want_logprobs, top_logprobs = logprob_settings(req)
    prompt = state.chat.render_chat(req, tools, dt.datetime.now(dt.timezone.utc).date())
    forced = forced_tool(req, tools)
    schema = response_schema(req, tools)
    # a forced call starts with its header; structured output goes straight to the final channel
    prefix = state.chat.tool_call_header(forced) if forced else state.chat.final_header() if schema else []
    end_ids = [state.chat.ids.return_]
    if forced:  # the arguments of a forced call are JSON under its parameters schema, then <|call|>
        schema, end_ids = tool_args_schema(tools, forced), [state.chat.ids.call]
    prompt = prompt + prefix
    # 'required' among several tools: the output must start with one of their call headers, and the
    # arguments after the header follow that tool's parameters schema, then <|call|>
    choose = prefix_schemas = None
    if req.tool_choice == "required" and not forced:
        choose = [state.chat.tool_call_header(t.name) for t in tools]
        prefix_schemas = [tool_args_schema(tools, t.name) or "" for t in tools]
        if any(prefix_schemas):
            end_ids = [state.chat.ids.call]
        else:
            prefix_schemas = None
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = max_new_tokens(requested, len(prompt), state.limits, param)

    request_id = "chatcmpl-" + secrets.token_hex(12)
    names = frozenset(t.name for t in tools)
    runs = []
    for i in range(req.n):
        sampling = sampling_params(req, max_tokens, state.chat.chat_stop_ids, i, want_logprobs, top_logprobs,
                                   choose, schema, end_ids if schema or prefix_schemas else None, prefix_schemas)
        stream = state.router.open(router_pb2.GenerateRequest(
            request_id=f"{request_id}-{i}", prompt_token_ids=prompt, sampling=sampling))
        runs.append(ChatChoiceRun(i, stream, state.chat.new_parser(names), StopMatcher(stops), prefix=prefix))
    state.metrics.prompt_tokens.inc(len(prompt))
    first_token = FirstToken(state.metrics, started, "chat")

    def finished() -> None:
        for run in runs:
            state.metrics.record_anomalies(run.parser.anomalies)
            if run.parser.anomalies:
                log.info("%s-%d: repaired Harmony output: %s", request_id, run.index, ",".join(run.parser.anomalies))
            state.metrics.completion_tokens.inc(run.completion_tokens)
        state.metrics.latency.labels(endpoint="chat").observe(time.monotonic() - started)

    if not req.stream:
        accs = [ChatAccumulator() for _ in runs]

        def on_step(index: int, step: Step) -> None:
            first_token.seen(step)
            accs[index].add(step)

        try:
            if not await collect(request, [r.steps() for r in runs], on_step, state.metrics):
                return Response(status_code=499)
        finally:
            finished()
        body = ChatCompletionResponse(
            id=request_id, model=state.limits.model_name,
            choices=[a.choice(i, state.chat, want_logprobs) for i, a in enumerate(accs)],
            usage=chat_usage(len(prompt), runs))
        return JSONResponse(body.model_dump())

    primed = await prime(request, [r.steps() for r in runs], state.metrics)
    if primed is None:
        finished()
        return Response(status_code=499)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    chunks = ChatChunks(state.chat, request_id, state.limits.model_name, int(time.time()), include_usage,
                        want_logprobs)

    def on_step(index: int, step: Step) -> list[str]:
        first_token.seen(step)
        return chunks.step(index, step)

    def finale() -> list[str]:
        return [chunks.usage(chat_usage(len(prompt), runs))] if include_usage else []

    async def body():
        try:
            async for line in stream_sse(request, primed, [chunks.opening(i) for i in range(req.n)], on_step,
                                         finale, state.metrics, request_id):
                yield line
        finally:
            finished()

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
