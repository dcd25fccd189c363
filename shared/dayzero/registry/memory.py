"""In-process registry (lives inside the router when no Redis is used) and the workers' client
for it: workers heartbeat over gRPC (``Registry`` service in worker.proto) to the router."""

from __future__ import annotations

import threading
import time

import grpc

from dayzero.rpc.v1 import worker_pb2, worker_pb2_grpc

from .base import Registry, RegistryError


class InProcessRegistry(Registry):
    """A dict with expiry, thread-safe. Records expire ``ttl_seconds`` after their last put."""

    url = "memory://"

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str], tuple[float, worker_pb2.WorkerRecord]] = {}

    def put(self, record: worker_pb2.WorkerRecord) -> None:
        rec = worker_pb2.WorkerRecord()
        rec.CopyFrom(record)
        with self._lock:
            self._records[(rec.role, rec.worker_id)] = (self._clock() + rec.ttl_seconds, rec)

    def remove(self, role: str, worker_id: str) -> None:
        with self._lock:
            self._records.pop((role, worker_id), None)

    def list(self, role: str = "") -> list[worker_pb2.WorkerRecord]:
        now = self._clock()
        with self._lock:
            for key in [k for k, (exp, _) in self._records.items() if exp <= now]:
                del self._records[key]
            recs = [r for (rl, _), (_, r) in self._records.items() if not role or rl == role]
        return sorted(recs, key=lambda r: (r.role, r.worker_id))


class RegistryServicer(worker_pb2_grpc.RegistryServicer):
    """The router's gRPC face of an ``InProcessRegistry`` (aio)."""

    def __init__(self, registry: InProcessRegistry):
        self.registry = registry

    async def Heartbeat(self, request, context):
        if not request.worker_id or not request.role or request.ttl_seconds <= 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "worker_id, role and ttl_seconds > 0 are required")
        self.registry.put(request)
        return worker_pb2.HeartbeatReply()

    async def Deregister(self, request, context):
        self.registry.remove(request.role, request.worker_id)
        return worker_pb2.HeartbeatReply()

    async def ListWorkers(self, request, context):
        return worker_pb2.ListWorkersResponse(workers=self.registry.list(request.role))


class RouterRegistryClient(Registry):
    """A worker's handle on the router-hosted registry (blocking calls, short timeouts)."""

    def __init__(self, target: str, timeout: float = 2.0):
        self.url = f"router://{target}"
        self._timeout = timeout
        self._channel = grpc.insecure_channel(target)
        self._stub = worker_pb2_grpc.RegistryStub(self._channel)

    def _call(self, fn, req):
        try:
            return fn(req, timeout=self._timeout)
        except grpc.RpcError as e:
            raise RegistryError(f"{self.url}: {e.code().name}: {e.details()}") from None

    def put(self, record: worker_pb2.WorkerRecord) -> None:
        self._call(self._stub.Heartbeat, record)

    def remove(self, role: str, worker_id: str) -> None:
        self._call(self._stub.Deregister, worker_pb2.DeregisterRequest(role=role, worker_id=worker_id))

    def list(self, role: str = "") -> list[worker_pb2.WorkerRecord]:
        return list(self._call(self._stub.ListWorkers, worker_pb2.ListWorkersRequest(role=role)).workers)

    def close(self) -> None:
        self._channel.close()
