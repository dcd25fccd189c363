"""A worker's heartbeat: writes its record (with fresh load) into the registry every interval.

Runs on a daemon thread. When the registry is unreachable it logs once, keeps trying, and logs
the re-registration when it succeeds again (e.g. after a Redis restart emptied the keys).
With a ``problem`` check (e.g. "the engine thread has not come round for a minute") the record
carries that problem in ``unavailable`` while it lasts, so routers stop picking a worker that is
alive but stuck at their next refresh (a removed record would stay routable for its TTL), and the
field clears once the problem does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dayzero.rpc.v1 import worker_pb2

from .base import Registry, RegistryError

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, registry: Registry, record: Callable[[], worker_pb2.WorkerRecord], interval: float = 1.0,
                 ttl: float | None = None, problem: Callable[[], str] | None = None):
        self.registry = registry
        self.record = record
        self.problem = problem or (lambda: "")
        self.withdrawn = ""                   # the problem the record is marked unavailable for ("" = none)
        self.interval = interval
        self.ttl = ttl if ttl is not None else max(3 * interval, 1.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="registry-heartbeat", daemon=True)
        self.registered = threading.Event()   # set after the first successful put
        self.beats = 0
        self.failures = 0                     # failed puts so far

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def beat(self) -> None:
        problem = self.problem()
        if problem and not self.withdrawn:
            log.warning("marked unavailable in %s: %s", self.registry.url, problem)
        elif not problem and self.withdrawn:
            log.info("available again (was: %s)", self.withdrawn)
        self.withdrawn = problem
        rec = self.record()
        rec.unavailable = problem
        rec.ttl_seconds = self.ttl
        rec.updated_at_unix = time.time()
        self.registry.put(rec)
        self.beats += 1

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.beat()
                if failing:
                    log.info("registry %s reachable again: re-registered", self.registry.url)
                elif not self.registered.is_set():
                    log.info("registered in %s (%s)", self.registry.url, self.registry.kind)
                failing = False
                self.registered.set()
            except RegistryError as e:
                self.failures += 1
                if not failing:
                    log.warning("registry heartbeat failed, retrying every %.1fs: %s", self.interval, e)
                failing = True
            except Exception:  # noqa: BLE001 - a bug in record() must not kill the heartbeat silently
                log.exception("registry heartbeat crashed, retrying")
                failing = True
            self._stop.wait(self.interval)

    def stop(self, deregister: bool = True) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval + 1)
        if deregister:
            try:
                rec = self.record()
                self.registry.remove(rec.role, rec.worker_id)
            except Exception as e:  # noqa: BLE001 - best effort at shutdown
                log.info("deregistration skipped: %s", e)
