"""The router's view of the workers: a registry snapshot refreshed in the background, gRPC
channels per worker, and short-lived suspicion of workers whose calls just failed."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from dayzero.registry import Registry, RegistryError
from dayzero.rpc.v1 import decode_pb2_grpc, prefill_pb2_grpc, worker_pb2
from dayzero.serving.grpc_util import CHANNEL_OPTIONS

log = logging.getLogger(__name__)


class WorkerView:
    def __init__(self, registry: Registry, refresh_seconds: float = 0.25, suspect_seconds: float = 3.0):
        self.registry = registry
        self.refresh_seconds = refresh_seconds
        self.suspect_seconds = suspect_seconds
        self.records: list[worker_pb2.WorkerRecord] = []
        # (role, worker_id) -> (last seen in the registry (monotonic), record): a record stays
        # routable for its TTL after it was last seen, so a registry that empties (a Redis
        # restart) or cannot be read does not empty the router until the workers re-register
        self._known: dict[tuple[str, str], tuple[float, worker_pb2.WorkerRecord]] = {}
        self.registry_ok = False
        self.registry_error = "not read yet"
        self._suspect: dict[str, float] = {}            # address -> until (monotonic); a restart gets a new one
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.pending_blocks: dict[str, int] = {}        # decode worker -> blocks placed, not yet in its load
        self.pending_tokens: dict[str, int] = {}        # prefill worker -> tokens placed, not yet in its load
        self._task: asyncio.Task | None = None

    async def refresh(self) -> None:
        try:
            recs = await asyncio.to_thread(self.registry.list, "")
            if not self.registry_ok:
                log.info("registry %s readable: %d worker(s)", self.registry.url, len(recs))
            self.registry_ok, self.registry_error = True, ""
        except RegistryError as e:
            if self.registry_ok:
                log.warning("registry unreadable, routing on the last records until they expire: %s", e)
            self.registry_ok, self.registry_error = False, str(e)
            recs = []
        now = time.monotonic()
        for r in recs:
            self._known[(r.role, r.worker_id)] = (now, r)
        for key, (seen, r) in list(self._known.items()):
            if seen + max(r.ttl_seconds, self.refresh_seconds) < now:
                del self._known[key]
        self.records = sorted((r for _, r in self._known.values()), key=lambda r: (r.role, r.worker_id))

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.refresh_seconds)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        for ch in self._channels.values():
            await ch.close()

    def live(self, role: str) -> list[worker_pb2.WorkerRecord]:
        now = time.monotonic()
        return [r for r in self.records
                if r.role == role and not r.unavailable and self._suspect.get(r.address, 0) <= now]

    def suspect(self, worker: worker_pb2.WorkerRecord, why: str) -> None:
        log.warning("%s worker %s (%s) failed: %s; avoiding it for %.0fs", worker.role, worker.worker_id,
                    worker.address, why, self.suspect_seconds)
        self._suspect[worker.address] = time.monotonic() + self.suspect_seconds

    def channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        return ch

    def decode_stub(self, w: worker_pb2.WorkerRecord) -> decode_pb2_grpc.DecodeStub:
        return decode_pb2_grpc.DecodeStub(self.channel(w.address))

    def prefill_stub(self, w: worker_pb2.WorkerRecord) -> prefill_pb2_grpc.PrefillStub:
        return prefill_pb2_grpc.PrefillStub(self.channel(w.address))
