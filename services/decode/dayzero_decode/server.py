"""gRPC face of the decode worker: Decode (Allocate/Generate/Release). On the same asyncio server:
KVTransfer (grpc transport only), and Worker.GetLoad and grpc.health.v1 from ``dayzero.serving.worker_main``."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from dayzero.kvcache import KVCacheFullError
from dayzero.rpc.v1 import common_pb2, decode_pb2, decode_pb2_grpc
from dayzero.runtime.engine import StepOutput
from dayzero.serving.protocol import FINISH, sampling_from_proto, token_logprob

from .worker import Aborted, DecodeWorker

log = logging.getLogger(__name__)


class DecodeServicer(decode_pb2_grpc.DecodeServicer):
    def __init__(self, worker: DecodeWorker, receiver_info, kv_wait_seconds: float = 30.0):
        self.worker = worker
        self.receiver_info = receiver_info
        self.kv_wait_seconds = kv_wait_seconds

    async def _on_engine(self, fn):
        return await asyncio.wrap_future(self.worker.call(fn))

    async def Allocate(self, request, context):
        if not request.request_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        try:
            alloc = await self._on_engine(lambda: self.worker.allocate(
                request.request_id, request.prompt_tokens, request.lease_seconds))
        except asyncio.CancelledError:
            # the caller gave up (deadline or cancel) while the allocation may have gone through: nobody
            # would ever learn the lease id, so free what the request holds (the engine thread runs
            # calls in order, so this runs after the allocation if that started)
            self._release_orphan(request.request_id)
            raise
        except KVCacheFullError as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:  # the reply would go nowhere
            self._release_orphan(request.request_id)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "allocation finished after the caller's deadline; freed")
        return decode_pb2.AllocateResponse(allocation=alloc, receiver=self.receiver_info)

    def _release_orphan(self, request_id: str) -> None:
        self.worker.call(lambda: self.worker.release(request_id, "", 0))

    async def Release(self, request, context):
        if not request.request_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        if request.kv_senders < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "kv_senders must be >= 0")
        found, freed = await self._on_engine(lambda: self.worker.release(request.request_id, request.lease_id,
                                                                         request.kv_senders))
        return decode_pb2.ReleaseResponse(released=found, blocks_freed=freed)

    async def _wait_landed(self, request, context) -> None:
        loop = asyncio.get_running_loop()
        landed: asyncio.Future = loop.create_future()

        def cb(ok: bool) -> None:
            loop.call_soon_threadsafe(lambda: landed.done() or landed.set_result(ok))

        t0 = time.perf_counter()
        await self._on_engine(lambda: self.worker.watch_lease(request.lease_id, request.request_id, cb))
        timeout = request.kv_wait_seconds or self.kv_wait_seconds
        try:
            ok = await asyncio.wait_for(landed, timeout)
        except asyncio.TimeoutError:
            await self._on_engine(lambda: self.worker.release(request.request_id, request.lease_id))
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"the KV of {request.request_id} did not land within {timeout:.1f}s; lease freed")
        if not ok:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"lease {request.lease_id} of {request.request_id} expired or was released")
        self.worker.metrics.kv_wait.observe(time.perf_counter() - t0)

    async def Generate(self, request, context):
        rid = request.request_id
        if not rid or not request.prompt_token_ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id and prompt_token_ids are required")
        try:
            params = sampling_from_proto(request.sampling)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def sink(item) -> None:
            loop.call_soon_threadsafe(q.put_nowait, item)

        prompt = list(request.prompt_token_ids)
        finished = False
        try:
            if request.lease_id:
                await self._wait_landed(request, context)
                try:
                    reason = await self._on_engine(lambda: self.worker.add_prefilled(
                        rid, request.lease_id, prompt, request.first_token_id, params, sink))
                except LookupError as e:
                    await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
                except ValueError as e:
                    await self._on_engine(lambda: self.worker.release(rid, request.lease_id))
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                if reason is not None:  # the first token already ended it
                    finished = True
                    self.worker.metrics.requests.labels(reason, "disaggregated").inc()
                    yield decode_pb2.DecodeResponse(finish_reason=FINISH[reason])
                    return
            else:
                try:
                    await self._on_engine(lambda: self.worker.add_local(rid, prompt, params, sink))
                except KVCacheFullError as e:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
                except ValueError as e:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            while True:
                items = [await q.get()]
                while not q.empty():
                    items.append(q.get_nowait())
                msg = decode_pb2.DecodeResponse()
                for item in items:
                    if isinstance(item, Aborted):  # released by request id from outside this stream
                        finished = True
                        msg.finish_reason = common_pb2.FINISH_REASON_ABORT
                        break
                    if isinstance(item, Exception):
                        finished = True
                        await context.abort(grpc.StatusCode.INTERNAL, f"decode failed: {item}")
                    out: StepOutput = item
                    if out.token_id >= 0:
                        msg.token_ids.append(out.token_id)
                        if params.logprobs is not None:
                            msg.logprobs.append(token_logprob(out.token_id, out.logprob, out.top_logprobs))
                    if out.finished:
                        finished = True
                        msg.finish_reason = FINISH.get(out.finish_reason or "stop", common_pb2.FINISH_REASON_STOP)
                yield msg
                if finished:
                    return
        finally:
            if not finished:  # cancelled, failed or the caller went away: free what this call holds
                self.worker.call(lambda: self.worker.cancel(rid, sink))  # only a request this call added
                if request.lease_id:
                    self.worker.call(lambda: self.worker.release(rid, request.lease_id))
                self.worker.metrics.requests.labels("abort", "disaggregated" if request.lease_id else "local").inc()
