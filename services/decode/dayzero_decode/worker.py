"""The decode worker's engine thread: leases, landed KV, continuous batching, token fan-out.

One thread owns the engine (it is not thread-safe). Everything else asks it to do things through
``call(fn)`` (a Future). The loop::

    while running:
        run queued calls (allocate, add, abort, release)
        mark leases whose KV landed (transport notifications); expire stale leases
        if the engine has work: step() and hand each token to its request's sink
        else: wait briefly for a call
        refresh the load snapshot and the metrics

A lease (``allocate``) holds blocks for a prompt's KV until a Generate consumes it (see
``leases.LeaseBook``: expiry, and blocks held back while a prefill worker may still write them).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dayzero.kvcache import KVCacheFullError
from dayzero.rpc.v1 import transfer_pb2, worker_pb2
from dayzero.runtime.engine import Engine, StepOutput
from dayzero.runtime.sampling import SamplingParams
from dayzero.serving.metrics import DecodeMetrics
from dayzero.transfer import KVReceiver

from .leases import UNKNOWN_SENDERS, LeaseBook

log = logging.getLogger(__name__)

Sink = Callable[[object], None]   # receives StepOutput items, then ABORTED or one Exception


class Aborted:
    """Handed to a sink when its request was aborted from outside its stream (Release by request id)."""


ABORTED = Aborted()


@dataclass
class Running:
    sink: Sink
    route: str
    started: float
    last_token: float | None = None


class DecodeWorker:
    def __init__(self, engine: Engine, receiver: KVReceiver | None, metrics: DecodeMetrics, worker_id: str,
                 lease_seconds: float = 30.0, max_waiting: int = 256, drain_seconds: float = 10.0,
                 fault_allocate_delay: float = 0.0):
        self.engine = engine
        self.fault_allocate_delay = fault_allocate_delay  # tests: an allocation that outlives its caller
        self.receiver = receiver
        self.metrics = metrics
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.max_waiting = max_waiting
        self.leases = LeaseBook(engine, receiver, metrics, lease_seconds, drain_seconds)
        self.running: dict[str, Running] = {}          # request_id -> sink
        self._calls: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="decode-engine", daemon=True)
        self._tick = time.monotonic()                  # start of the engine loop's latest round
        self.load = worker_pb2.WorkerLoad(worker_id=worker_id, role="decode")
        metrics.max_batch.set(engine.config.max_num_seqs)
        self._refresh()

    # ---- thread plumbing ------------------------------------------------------------------------
    def start(self) -> "DecodeWorker":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def call(self, fn: Callable[[], object]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((fn, fut))
        return fut

    def _run_calls(self, timeout: float) -> None:
        try:
            item = self._calls.get(timeout=timeout) if timeout > 0 else self._calls.get_nowait()
        except queue.Empty:
            return
        while True:
            fn, fut = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return

    def stalled_for(self) -> float:
        """Seconds since the engine loop last came round (a round takes milliseconds when healthy)."""
        return time.monotonic() - self._tick if self._thread.is_alive() else 0.0

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._tick = time.monotonic()
            busy = self.engine.has_unfinished()
            self._run_calls(0 if busy else (0.001 if self.leases.busy() else 0.02))
            self.leases.poll()
            self.leases.expire()
            if self.engine.has_unfinished():
                t0 = time.perf_counter()
                try:
                    outputs = self.engine.step()
                except Exception as e:  # noqa: BLE001 - fail the batch, keep the worker alive
                    log.exception("engine step failed; aborting the running requests")
                    self._fail_all(e)
                    outputs = []
                self.metrics.step.observe(time.perf_counter() - t0)
                self._dispatch(outputs)
            self._refresh()
        self._fail_all(RuntimeError("decode worker shutting down"))

    # ---- engine-thread operations ---------------------------------------------------------------
    def allocate(self, request_id: str, prompt_tokens: int, lease_seconds: float) -> transfer_pb2.KVAllocation:
        if prompt_tokens < 1:
            raise ValueError("prompt_tokens must be >= 1")
        self._admission_check()
        seconds = lease_seconds if lease_seconds > 0 else self.lease_seconds
        alloc = self.leases.allocate(request_id, prompt_tokens, seconds)
        if self.fault_allocate_delay > 0:
            time.sleep(self.fault_allocate_delay)
        return alloc

    def watch_lease(self, lease_id: str, request_id: str, cb: Callable[[bool], None]) -> None:
        """``cb(True)`` once the lease's KV has landed, ``cb(False)`` if the lease is gone."""
        self.leases.watch(lease_id, request_id, cb)

    def add_prefilled(self, request_id: str, lease_id: str, prompt: list[int], first_token: int,
                      params: SamplingParams, sink: Sink) -> str | None:
        self.leases.take(lease_id, request_id, len(prompt))  # LookupError / ValueError
        try:
            reason = self.engine.add_prefilled(request_id, prompt, first_token, params)
        except Exception:
            self.engine.free(request_id)
            raise
        if reason is None:
            self.running[request_id] = Running(sink, "disaggregated", time.perf_counter())
        return reason

    def add_local(self, request_id: str, prompt: list[int], params: SamplingParams, sink: Sink) -> None:
        self._admission_check()
        if not self.engine.kv.can_fit(None, len(prompt) + 1):
            raise KVCacheFullError(f"KV cache full: {len(prompt)} prompt tokens do not fit now")
        self.engine.add_request(request_id, prompt, params)
        self.running[request_id] = Running(sink, "local", time.perf_counter())

    def abort(self, request_id: str) -> bool:
        """Abort a request; its stream (if any) is told, so that it ends instead of waiting forever."""
        run = self.running.pop(request_id, None)
        if run is not None:
            run.sink(ABORTED)
        return self.engine.abort(request_id)

    def cancel(self, request_id: str, sink: Sink) -> bool:
        """The stream whose sink is ``sink`` went away: abort its request, but only if that stream
        owns it (a failed duplicate Generate with the same id must not abort the live one)."""
        run = self.running.get(request_id)
        if run is None or run.sink is not sink:
            return False
        del self.running[request_id]
        return self.engine.abort(request_id)

    def release(self, request_id: str, lease_id: str, senders: int = UNKNOWN_SENDERS) -> tuple[bool, int]:
        """Free a lease (or, with no lease id, whatever the request holds: its leases and, if it
        runs, the request itself, whose stream then ends with an abort). ``senders``: how many
        prefill workers were handed the lease (see ``LeaseBook.release``). (found anything, blocks freed)."""
        before = self.engine.kv.num_used_blocks
        found = self.leases.release(request_id, lease_id, senders)
        if not lease_id:
            found = self.abort(request_id) or found
        return found, before - self.engine.kv.num_used_blocks

    # ---- internals -------------------------------------------------------------------------------
    def _admission_check(self) -> None:
        if len(self.engine.scheduler.waiting) >= self.max_waiting:
            raise KVCacheFullError(f"decode queue full ({self.max_waiting} requests waiting)")

    def _dispatch(self, outputs: list[StepOutput]) -> None:
        now = time.perf_counter()
        for out in outputs:
            run = self.running.get(out.request_id)
            if run is None:
                continue
            if run.last_token is None:
                self.metrics.ttft.labels(run.route).observe(now - run.started)
            else:
                self.metrics.itl.observe(now - run.last_token)
            run.last_token = now
            if out.finished:
                del self.running[out.request_id]
                self.metrics.requests.labels(out.finish_reason or "stop", run.route).inc()
            run.sink(out)

    def _fail_all(self, err: Exception) -> None:
        for rid, run in list(self.running.items()):
            self.engine.abort(rid)
            run.sink(err)
        self.running.clear()

    def _refresh(self) -> None:
        e, kv = self.engine, self.engine.kv
        total = kv.full_alloc.num_blocks + kv.ring_alloc.num_blocks
        used = kv.num_used_blocks
        sched = e.scheduler
        queued = sched.num_queued_tokens()
        load = worker_pb2.WorkerLoad(
            worker_id=self.worker_id, role="decode", queued_tokens=queued, queued_requests=len(sched.waiting),
            running_requests=len(sched.running), kv_blocks_total=total, kv_blocks_used=used,
            kv_blocks_free=total - used, open_leases=len(self.leases), ready=True)
        self.load = load
        m = self.metrics
        m.running.set(load.running_requests)
        m.waiting.set(load.queued_requests)
        m.queued_tokens.set(queued)
        m.kv_used.set(used)
        m.kv_free.set(total - used)
        m.kv_total.set(total)
        m.kv_usage.set(used / total if total else 0.0)
        m.leases.set(len(self.leases))
