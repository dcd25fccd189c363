"""Serving loops shared by chat and text completions: collect, or stream as SSE; both stop the
downstream calls when the client goes away."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Callable

from starlette.requests import Request

from dayzero_frontend.choices import Step
from dayzero_frontend.errors import APIError
from dayzero_frontend.metrics import FrontendMetrics
from dayzero_frontend.streaming import DONE, fan_in, wait_for_disconnect

log = logging.getLogger("dayzero.frontend")
_DISCONNECTED = object()
_END = object()


class FirstToken:
    """Observes the time to the first generated token of a request once."""

    def __init__(self, metrics: FrontendMetrics, started: float, endpoint: str):
        self.metrics, self.started, self.endpoint, self.done = metrics, started, endpoint, False

    def seen(self, step: Step) -> None:
        if not self.done and step.token_ids:
            self.done = True
            self.metrics.ttft.labels(endpoint=self.endpoint).observe(time.monotonic() - self.started)


async def _chain(first: Step, rest: AsyncIterator[Step]) -> AsyncIterator[Step]:
    yield first
    async for step in rest:
        yield step


async def prime(request: Request, runs: list[AsyncIterator[Step]],
                metrics: FrontendMetrics) -> list[AsyncIterator[Step]] | None:
    """Wait for every choice's first step so that early router errors become HTTP statuses.

    None when the client went away meanwhile (the calls are then cancelled)."""
    firsts_task = asyncio.ensure_future(asyncio.gather(*(anext(r) for r in runs), return_exceptions=True))
    watcher = asyncio.create_task(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({firsts_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if firsts_task not in done:
        firsts_task.cancel()
        await asyncio.gather(firsts_task, return_exceptions=True)
        await asyncio.gather(*(r.aclose() for r in runs), return_exceptions=True)
        metrics.client_disconnects.inc()
        return None
    firsts = firsts_task.result()
    failure = next((f for f in firsts if isinstance(f, BaseException)), None)
    if failure is not None:
        await asyncio.gather(*(r.aclose() for r in runs), return_exceptions=True)
        if isinstance(failure, StopAsyncIteration):
            raise APIError(502, "router: the stream ended without any message", code="empty_stream")
        raise failure
    return [_chain(f, r) for f, r in zip(firsts, runs)]


async def collect(request: Request, runs: list[AsyncIterator[Step]], on_step: Callable[[int, Step], None],
                  metrics: FrontendMetrics) -> bool:
    """Consume every step; False when the client disconnected first (downstream then cancelled)."""

    async def consume() -> None:
        async for index, step in fan_in(runs):
            on_step(index, step)

    work = asyncio.create_task(consume())
    watcher = asyncio.create_task(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work not in done:
            metrics.client_disconnects.inc()
            return False
        work.result()  # re-raises an APIError from downstream
        return True
    finally:
        for task in (work, watcher):
            task.cancel()
        await asyncio.gather(work, watcher, return_exceptions=True)


async def stream_sse(request: Request, runs: list[AsyncIterator[Step]], opening: list[str],
                     on_step: Callable[[int, Step], list[str]], finale: Callable[[], list[str]],
                     metrics: FrontendMetrics, request_id: str) -> AsyncIterator[str]:
    """SSE lines of a streamed completion. A downstream failure mid-stream becomes an error event
    followed by ``[DONE]``; the stream always ends cleanly."""
    queue: asyncio.Queue = asyncio.Queue()

    async def produce() -> None:
        try:
            for line in opening:
                await queue.put(line)
            async for index, step in fan_in(runs):
                for line in on_step(index, step):
                    await queue.put(line)
            for line in finale():
                await queue.put(line)
        except APIError as e:
            log.warning("%s: failed mid-stream: %s", request_id, e.message)
            await queue.put(f"data: {e.body().model_dump_json()}\n\n")
        except Exception as e:  # noqa: BLE001 - a stream is never cut: report, then end it
            log.exception("%s: unexpected failure mid-stream", request_id)
            body = APIError(500, f"internal error: {type(e).__name__}").body()
            await queue.put(f"data: {body.model_dump_json()}\n\n")
        await queue.put(DONE)
        await queue.put(_END)

    async def watch() -> None:
        await wait_for_disconnect(request)
        await queue.put(_DISCONNECTED)

    producer = asyncio.create_task(produce())
    watcher = asyncio.create_task(watch())
    try:
        while True:
            item = await queue.get()
            if item is _END:
                return
            if item is _DISCONNECTED:
                metrics.client_disconnects.inc()
                log.info("%s: client disconnected; cancelling downstream", request_id)
                return
            yield item
    finally:
        for task in (producer, watcher):
            task.cancel()
        await asyncio.gather(producer, watcher, return_exceptions=True)
