"""The prefill worker's engine thread: one request at a time from a queue.

For each job: check the receiver's handshake (before any compute), prefill the prompt chunk by
chunk (a cancelled job stops between chunks), write the KV of the prompt into the decode
worker's leased blocks through the transport, free the local blocks, return the first token.
No write starts once the decode worker's lease is (nearly) over: it frees the blocks of an ended
lease and may already have handed them to another request. A cancelled job stops before its next
write.
With an overlapping transport (NIXL) the full-attention blocks a chunk completes start moving
right after that chunk while the next one computes; the last write (the partial last block and
the sliding-window rings) carries the notification that tells the decode worker the KV is in.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from dayzero.rpc.v1 import prefill_pb2, worker_pb2
from dayzero.runtime.engine import Engine
from dayzero.runtime.sampling import SamplingParams
from dayzero.serving.metrics import PrefillMetrics
from dayzero.serving.protocol import token_logprob
from dayzero.transfer import KVSender, TransferError, TransferPlan, check_compatible

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """The caller went away; the job stopped and freed what it held."""


class QueueFull(Exception):
    """Too many prompt tokens queued (backpressure: RESOURCE_EXHAUSTED)."""


class LeaseExpired(Exception):
    """The decode worker's lease on the target blocks ended (or is about to): writing now could
    overwrite blocks that already belong to another request there, so nothing more is written."""


# a write must start at least this long before the lease ends (it must land before the decode
# worker frees the blocks; also absorbs small clock differences between the two hosts)
LEASE_MARGIN_SECONDS = 0.5


def check_lease(target, what: str) -> None:
    """Raise ``LeaseExpired`` unless ``target`` (a KVAllocation) still has a margin left."""
    if not target.expires_at_unix:
        return
    left = target.expires_at_unix - time.time()
    if left < LEASE_MARGIN_SECONDS:
        state = f"expired {-left:.1f}s ago" if left < 0 else f"ends in {left:.1f}s"
        raise LeaseExpired(f"the decode worker's KV lease {target.lease_id} of {target.request_id} {state}; "
                           f"refusing to write its blocks {what}")


def check_target_blocks(req: prefill_pb2.PrefillRequest, num_layers: int) -> None:
    """Every destination block id must exist in the receiver's pool of its layer (ValueError)."""
    sizes: dict[int, int] = {}
    for region in req.receiver.regions:
        sizes[region.layer] = min(sizes.get(region.layer, region.num_blocks), region.num_blocks)
    for layer, blocks in enumerate(req.target.layers[:num_layers]):
        if layer not in sizes:
            raise ValueError(f"the decode worker describes no KV pool for layer {layer}")
        bad = [b for b in blocks.block_ids if not 0 <= b < sizes[layer]]
        if bad:
            raise ValueError(f"the decode allocation names block(s) {bad[:5]} of layer {layer}, outside its "
                             f"pool of {sizes[layer]} blocks")


@dataclass
class Job:
    request: prefill_pb2.PrefillRequest
    params: SamplingParams
    enqueued: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    result: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_token_ids)


class PrefillWorker:
    def __init__(self, engine: Engine, sender: KVSender, metrics: PrefillMetrics, worker_id: str,
                 max_queued_tokens: int = 1 << 20, transfer_timeout: float = 30.0, chunk_delay: float = 0.0):
        self.engine = engine
        self.sender = sender
        self.metrics = metrics
        self.worker_id = worker_id
        self.max_queued_tokens = max_queued_tokens
        self.transfer_timeout = transfer_timeout
        self.chunk_delay = chunk_delay        # fault-injection seam for tests: sleep after each chunk
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._queued_tokens = 0
        self._queued_requests = 0
        self._running = False
        self._progress_at: float | None = None  # engine thread: last progress of the current job
        self._thread = threading.Thread(target=self._loop, name="prefill-engine", daemon=True)
        self.load = worker_pb2.WorkerLoad(worker_id=worker_id, role="prefill")
        self._refresh()

    def start(self) -> "PrefillWorker":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)

    def submit(self, job: Job) -> Job:
        with self._lock:
            if self._queued_tokens and self._queued_tokens + job.num_tokens > self.max_queued_tokens:
                raise QueueFull(f"prefill queue full: {self._queued_tokens} tokens queued "
                                f"(limit {self.max_queued_tokens})")
            self._queued_tokens += job.num_tokens
            self._queued_requests += 1
        self._refresh()
        self._jobs.put(job)
        return job

    def stalled_for(self) -> float:
        """Seconds since the engine thread's current job last made progress (started or finished a
        prefill chunk); 0 while it waits for a job."""
        last = self._progress_at
        return 0.0 if last is None else time.monotonic() - last

    def _loop(self) -> None:
        while True:
            self._progress_at = None
            job = self._jobs.get()
            if job is None:
                return
            self._progress_at = time.monotonic()
            if job.result.set_running_or_notify_cancel():  # else cancelled while queued (the servicer said so)
                try:
                    job.result.set_result(self._run(job))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    self.stopped(job.request)  # after every write of the job ended
                    job.result.set_exception(e)
            with self._lock:
                self._queued_tokens -= job.num_tokens
                self._queued_requests -= 1
            self._refresh()

    def stopped(self, req: prefill_pb2.PrefillRequest) -> None:
        """Tell the decode worker this call writes nothing (more) into its lease: it keeps the blocks
        of a released lease until every prefill worker handed it has said so (one-sided writes)."""
        self.sender.stopped(req.receiver, req.request_id, req.target.lease_id)

    def _run(self, job: Job) -> prefill_pb2.PrefillResponse:
        req = job.request
        waited = time.perf_counter() - job.enqueued
        self.metrics.queue_wait.observe(waited)
        if job.cancelled.is_set():
            raise Cancelled(req.request_id)
        # handshake before any compute: an incompatible receiver is refused at once
        check_compatible(self.sender.memory.compat, req.receiver.compat, "decode worker")
        if req.receiver.transport != self.sender.name:
            raise TransferError(f"the decode worker receives KV over {req.receiver.transport!r} but this prefill "
                                f"worker sends over {self.sender.name!r}; start both with the same --transport")
        n = len(req.prompt_token_ids)
        if req.target.num_tokens != n:
            raise ValueError(f"the decode allocation holds {req.target.num_tokens} tokens, the prompt has {n}")
        local_id = f"{req.request_id}/{uuid.uuid4().hex[:8]}"
        kv = self.engine.kv
        num_layers = len(kv.spec.layer_types)
        dst = [list(layer.block_ids) for layer in req.target.layers]
        if len(dst) != num_layers:
            raise ValueError(f"the decode allocation lists {len(dst)} layers, the model has {num_layers}")
        check_target_blocks(req, num_layers)
        check_lease(req.target, f"(after {waited:.1f}s in the prefill queue)")
        full_layers = [layer for layer in range(num_layers) if not kv.is_sliding(layer)]
        posted = []      # writes of finished full-attention blocks, moving while later chunks compute
        sent = [0]       # full-attention blocks (per full layer) already posted

        def post_finished(done: int) -> None:
            k = done // kv.BS
            if k <= sent[0] or not full_layers:
                return
            src = kv.layer_blocks(local_id, k * kv.BS)
            pairs: list[list[tuple[int, int]]] = [[] for _ in range(num_layers)]
            for layer in full_layers:
                pairs[layer] = list(zip(src[layer][sent[0]:k], dst[layer][sent[0]:k]))
            posted.append(self.sender.post(req.receiver, TransferPlan(req.request_id, req.target.lease_id, pairs),
                                           notify=False))
            sent[0] = k

        self._running = True
        self._refresh()
        t0 = time.perf_counter()
        try:
            def on_chunk(_rid: str, done: int) -> None:
                self._progress_at = time.monotonic()
                if self.chunk_delay:
                    time.sleep(self.chunk_delay)
                if job.cancelled.is_set():  # before posting: a cancelled job writes nothing more
                    raise Cancelled(req.request_id)
                if self.sender.overlaps and done < n:
                    check_lease(req.target, "(it ended while the prompt was being computed)")
                    post_finished(done)

            sample = self.engine.prefill_only(local_id, list(req.prompt_token_ids), job.params, on_chunk=on_chunk)
            compute = time.perf_counter() - t0
            self.metrics.compute.observe(compute)
            if job.cancelled.is_set():
                raise Cancelled(req.request_id)
            t_kv = time.perf_counter()
            try:
                early = []
                while posted:
                    early.append(self.sender.wait(posted.pop(0), self.transfer_timeout))
                src = kv.layer_blocks(local_id, n)
                rest = [layer[sent[0]:] if i in full_layers else layer for i, layer in enumerate(src)]
                dst_rest = [layer[sent[0]:] if i in full_layers else layer for i, layer in enumerate(dst)]
                plan = TransferPlan.from_blocks(req.request_id, req.target.lease_id, rest, dst_rest)
                check_lease(req.target, "(it ended while the prompt was being computed)")
                result = self.sender.send(req.receiver, plan, timeout=self.transfer_timeout)
            except TransferError as e:
                self.metrics.kv_failures.labels(self.sender.name, type(e).__name__).inc()
                raise
            kv_seconds = time.perf_counter() - t_kv  # the part of the handoff not hidden behind compute
            kv_bytes = result.bytes + sum(r.bytes for r in early)
            self.metrics.kv_seconds.labels(result.transport).observe(kv_seconds)
            self.metrics.kv_bytes.labels(result.transport).inc(kv_bytes)
        finally:
            while posted:  # failed or cancelled: finish (or abort) writes before the blocks are freed
                try:
                    self.sender.wait(posted.pop(0), 5.0)
                except TransferError:
                    pass
            self.engine.free(local_id)
            self._running = False
        resp = prefill_pb2.PrefillResponse(first_token_id=sample.token_id, kv_bytes=kv_bytes,
                                           kv_transfer_seconds=kv_seconds, prefill_seconds=compute,
                                           queue_seconds=waited, transport=result.transport)
        if job.params.logprobs is not None:
            resp.first_logprob.CopyFrom(token_logprob(sample.token_id, sample.logprob, sample.top_logprobs))
        return resp

    def _refresh(self) -> None:
        kv = self.engine.kv
        total = kv.full_alloc.num_blocks + kv.ring_alloc.num_blocks
        used = kv.num_used_blocks
        with self._lock:
            queued, nreq = self._queued_tokens, self._queued_requests
        self.load = worker_pb2.WorkerLoad(worker_id=self.worker_id, role="prefill", queued_tokens=queued,
                                          queued_requests=nreq, running_requests=1 if self._running else 0,
                                          kv_blocks_total=total, kv_blocks_used=used, kv_blocks_free=total - used,
                                          ready=True)
        self.metrics.queued_tokens.set(queued)
        self.metrics.queue_length.set(nreq)
