"""Router.Generate: allocate on a decode worker, prefill on a prefill worker (or locally on the
decode worker for short prompts), then relay the decode worker's token stream.

Every hop has a timeout; a cancelled client cancels every outbound call and releases the lease;
errors come back as gRPC status codes (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE,
DEADLINE_EXCEEDED, FAILED_PRECONDITION, INTERNAL). The first message reports the route taken.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

import grpc

from dayzero.rpc.v1 import common_pb2, decode_pb2, prefill_pb2, router_pb2, router_pb2_grpc, worker_pb2
from dayzero.serving.metrics import RouterMetrics

from .policy import blocks_needed, plan_route
from .workers import WorkerView

log = logging.getLogger(__name__)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass
class LeaseUse:
    """What the router did with one decode lease: how many prefill calls it was handed to."""

    senders: int = 0


class RouteError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class RouterConfig:
    disagg_threshold: int = 256         # prompts with fewer tokens are prefilled on the decode worker
    allocate_timeout: float = 10.0
    prefill_timeout: float = 120.0
    token_timeout: float = 60.0         # longest wait for the next decode message
    release_timeout: float = 5.0
    kv_wait_seconds: float = 30.0
    max_prefill_attempts: int = 2

    @property
    def lease_seconds(self) -> float:
        """How long a decode worker keeps an allocation for the KV to land: as long as this router
        may wait for the prefill (a lease that ended sooner would make a queued prefill fail, or,
        without the prefill worker's check, write blocks the decode worker had already reused).
        The router releases the lease itself on every failure; expiry only matters if it dies."""
        return self.allocate_timeout + self.prefill_timeout * max(1, self.max_prefill_attempts)


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, view: WorkerView, config: RouterConfig, metrics: RouterMetrics):
        self.view = view
        self.config = config
        self.metrics = metrics
        self._background: set[asyncio.Task] = set()

    # ---- entry point -----------------------------------------------------------------------------
    async def Generate(self, request, context):
        rid = request.request_id or uuid.uuid4().hex
        wid = f"{rid}.{uuid.uuid4().hex[:8]}"  # the id on the workers: unique even if clients reuse ids
        s = request.sampling
        if not request.prompt_token_ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt_token_ids is empty")
        if s.max_tokens <= 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.max_tokens must be > 0, got {s.max_tokens}")
        state = {"route": "none", "t0": time.perf_counter(), "last": None, "outcome": "error"}
        self.metrics.inflight.inc()
        try:
            async for msg in self._generate(wid, request, state):
                msg.request_id = rid
                now = time.perf_counter()
                if msg.token_ids:
                    if state["last"] is None:
                        self.metrics.ttft.labels(state["route"]).observe(now - state["t0"])
                    else:
                        self.metrics.itl.observe((now - state["last"]) / len(msg.token_ids))
                    state["last"] = now
                if msg.finish_reason:
                    state["outcome"] = common_pb2.FinishReason.Name(msg.finish_reason).removeprefix("FINISH_REASON_").lower()
                yield msg
        except RouteError as e:
            state["outcome"] = e.code.name.lower()
            log.info("request %s failed: %s: %s", wid, e.code.name, e.message)
            await context.abort(e.code, e.message)
        except asyncio.CancelledError:
            state["outcome"] = "cancelled"
            raise
        finally:
            self.metrics.inflight.dec()
            self.metrics.requests.labels(state["outcome"], state["route"]).inc()

    async def _generate(self, rid: str, request, state: dict):
        prompt = list(request.prompt_token_ids)
        decodes = self.view.live("decode")
        if not decodes:
            why = "" if self.view.registry_ok else f" (registry: {self.view.registry_error})"
            raise RouteError(grpc.StatusCode.UNAVAILABLE, f"no decode worker available{why}")
        plan = plan_route(len(prompt), decodes, self.view.live("prefill"), self.config.disagg_threshold,
                          self.view.pending_blocks, self.view.pending_tokens)
        if plan.disaggregate:
            state["route"] = "disaggregated"
            async for m in self._disaggregated(rid, request, prompt, plan):
                yield m
        else:
            state["route"] = "local"
            async for m in self._local(rid, request, prompt, plan):
                yield m

    # ---- helpers ---------------------------------------------------------------------------------
    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, decode: worker_pb2.WorkerRecord, rid: str, lease_id: str, senders: int = 0) -> None:
        try:
            await self.view.decode_stub(decode).Release(
                decode_pb2.ReleaseRequest(request_id=rid, lease_id=lease_id, kv_senders=senders),
                timeout=self.config.release_timeout)
        except grpc.RpcError as e:
            log.info("release of %s on %s failed (%s); the lease expires on its own", rid, decode.worker_id,
                     e.code().name)

    @staticmethod
    def _response(rid: str, msg: decode_pb2.DecodeResponse) -> router_pb2.GenerateResponse:
        return router_pb2.GenerateResponse(request_id=rid, token_ids=msg.token_ids, logprobs=msg.logprobs,
                                           finish_reason=msg.finish_reason)

    async def _relay(self, rid: str, decode: worker_pb2.WorkerRecord, call, first: dict | None):
        """Relay a decode stream; ``first`` fields go onto the first message relayed."""
        it = call.__aiter__()
        while True:
            try:
                msg = await asyncio.wait_for(it.__anext__(), self.config.token_timeout)
            except StopAsyncIteration:
                raise RouteError(grpc.StatusCode.INTERNAL,
                                 f"decode worker {decode.worker_id} ended the stream without a finish reason")
            except asyncio.TimeoutError:
                raise RouteError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 f"decode worker {decode.worker_id} sent nothing for {self.config.token_timeout:.0f}s")
            except grpc.RpcError as e:
                code = e.code()
                if code in RETRYABLE or code == grpc.StatusCode.CANCELLED:
                    self.view.suspect(decode, code.name)
                    raise RouteError(grpc.StatusCode.UNAVAILABLE,
                                     f"decode worker {decode.worker_id} failed mid-stream: {code.name}: {e.details()}")
                raise RouteError(code, f"decode worker {decode.worker_id}: {e.details()}")
            out = self._response(rid, msg)
            if first is not None:
                for k, v in first.items():
                    setattr(out, k, v)
                first = None
            yield out
            if msg.finish_reason:
                return

    # ---- local: the decode worker prefills the prompt itself -------------------------------------
    async def _local(self, rid: str, request, prompt: list[int], plan):
        exhausted = []
        for decode in plan.decodes:
            call = self.view.decode_stub(decode).Generate(decode_pb2.DecodeRequest(
                request_id=rid, prompt_token_ids=prompt, sampling=request.sampling))
            first = {"prompt_tokens": len(prompt), "route": "local"}
            done = False
            try:
                async for out in self._relay(rid, decode, call, first):
                    first = None
                    yield out
                done = True
                return
            except RouteError as e:
                if first is not None and e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    exhausted.append(f"{decode.worker_id}: {e.message}")
                    continue  # nothing sent yet: try the next decode worker
                if first is not None and e.code == grpc.StatusCode.UNAVAILABLE and len(plan.decodes) > 1:
                    continue
                raise
            finally:
                if not done:
                    call.cancel()
        if exhausted:
            raise RouteError(grpc.StatusCode.RESOURCE_EXHAUSTED, "every decode worker is full: " + "; ".join(exhausted))
        raise RouteError(grpc.StatusCode.UNAVAILABLE, "no decode worker could take the request")

    # ---- disaggregated: allocate on decode, prefill elsewhere, then decode ------------------------
    async def _allocate(self, rid: str, prompt_tokens: int, request, plan):
        exhausted, failed = [], []
        for decode in plan.decodes:
            try:
                resp = await self.view.decode_stub(decode).Allocate(
                    decode_pb2.AllocateRequest(request_id=rid, prompt_tokens=prompt_tokens,
                                               max_tokens=request.sampling.max_tokens,
                                               lease_seconds=self.config.lease_seconds),
                    timeout=self.config.allocate_timeout)
                return decode, resp
            except asyncio.CancelledError:
                self._spawn(self._release(decode, rid, "", 0))  # it may have allocated: free it
                raise
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:  # the reply may be lost after allocating
                    self._spawn(self._release(decode, rid, "", 0))
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    exhausted.append(f"{decode.worker_id}: {e.details()}")
                elif code in RETRYABLE:
                    self.view.suspect(decode, code.name)
                    failed.append(f"{decode.worker_id}: {code.name}")
                else:
                    raise RouteError(code, f"decode worker {decode.worker_id}: {e.details()}")
        if exhausted:
            raise RouteError(grpc.StatusCode.RESOURCE_EXHAUSTED, "every decode worker is full: " + "; ".join(exhausted))
        raise RouteError(grpc.StatusCode.UNAVAILABLE, "no decode worker reachable: " + "; ".join(failed))

    async def _prefill(self, rid: str, request, prompt: list[int], alloc, plan, use: LeaseUse):
        errors = []
        for prefill in plan.prefills[: self.config.max_prefill_attempts]:
            call = self.view.prefill_stub(prefill).Prefill(
                prefill_pb2.PrefillRequest(request_id=rid, prompt_token_ids=prompt, sampling=request.sampling,
                                           target=alloc.allocation, receiver=alloc.receiver),
                timeout=self.config.prefill_timeout)
            use.senders += 1
            self.view.pending_tokens[prefill.worker_id] = self.view.pending_tokens.get(prefill.worker_id, 0) + len(prompt)
            try:
                return await call
            except grpc.RpcError as e:
                code = e.code()
                if code in RETRYABLE:
                    if code == grpc.StatusCode.UNAVAILABLE:
                        self.view.suspect(prefill, code.name)
                    errors.append(f"prefill worker {prefill.worker_id} failed: {code.name}: {e.details()}")
                    continue
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    errors.append(f"{prefill.worker_id}: {e.details()}")
                    continue
                raise RouteError(code, f"prefill worker {prefill.worker_id}: {e.details()}")
            finally:
                call.cancel()
                self.view.pending_tokens[prefill.worker_id] -= len(prompt)
        code = grpc.StatusCode.RESOURCE_EXHAUSTED if errors and all("failed" not in e for e in errors) \
            else grpc.StatusCode.UNAVAILABLE
        raise RouteError(code, "; ".join(errors) or "no prefill worker available")

    async def _disaggregated(self, rid: str, request, prompt: list[int], plan):
        decode, alloc = await self._allocate(rid, len(prompt), request, plan)
        lease = alloc.allocation.lease_id
        blocks = blocks_needed(len(prompt), alloc.receiver.compat.block_size)
        self.view.pending_blocks[decode.worker_id] = self.view.pending_blocks.get(decode.worker_id, 0) + blocks
        call = None
        finished = False
        use = LeaseUse()
        try:
            presp = await self._prefill(rid, request, prompt, alloc, plan, use)
            self.view.pending_blocks[decode.worker_id] -= blocks
            blocks = 0
            first = router_pb2.GenerateResponse(request_id=rid, token_ids=[presp.first_token_id],
                                                prompt_tokens=len(prompt), route="disaggregated")
            if request.sampling.logprobs:
                first.logprobs.append(presp.first_logprob)
            yield first
            call = self.view.decode_stub(decode).Generate(decode_pb2.DecodeRequest(
                request_id=rid, prompt_token_ids=prompt, sampling=request.sampling, lease_id=lease,
                first_token_id=presp.first_token_id, first_logprob=presp.first_logprob,
                kv_wait_seconds=self.config.kv_wait_seconds))
            async for out in self._relay(rid, decode, call, None):
                yield out
            finished = True
        finally:
            if blocks:
                self.view.pending_blocks[decode.worker_id] -= blocks
            if call is not None and not finished:
                call.cancel()
            if not finished:  # failed or cancelled: free the lease now rather than at expiry (the decode
                # worker keeps its blocks until the prefill workers handed it said they stopped writing)
                self._spawn(self._release(decode, rid, lease, use.senders))
