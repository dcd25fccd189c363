"""Redis registry: one key per worker, ``dayzero:worker:{role}:{id}`` = serialized WorkerRecord,
with a TTL the heartbeat refreshes. A Redis restart loses the keys; the next heartbeat writes
them again (re-registration needs nothing special)."""

from __future__ import annotations

import redis

from dayzero.rpc.v1 import worker_pb2

from .base import Registry, RegistryError

PREFIX = "dayzero:worker:"


class RedisRegistry(Registry):
    def __init__(self, url: str, timeout: float = 2.0):
        self.url = url
        self._r = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)

    @staticmethod
    def key(role: str, worker_id: str) -> str:
        return f"{PREFIX}{role}:{worker_id}"

    def put(self, record: worker_pb2.WorkerRecord) -> None:
        ttl_ms = max(1, int(record.ttl_seconds * 1000))
        try:
            self._r.set(self.key(record.role, record.worker_id), record.SerializeToString(), px=ttl_ms)
        except redis.RedisError as e:
            raise RegistryError(f"redis {self.url}: {e}") from None

    def remove(self, role: str, worker_id: str) -> None:
        try:
            self._r.delete(self.key(role, worker_id))
        except redis.RedisError as e:
            raise RegistryError(f"redis {self.url}: {e}") from None

    def list(self, role: str = "") -> list[worker_pb2.WorkerRecord]:
        pattern = f"{PREFIX}{role}:*" if role else f"{PREFIX}*"
        try:
            keys = list(self._r.scan_iter(match=pattern, count=500))
            values = self._r.mget(keys) if keys else []
        except redis.RedisError as e:
            raise RegistryError(f"redis {self.url}: {e}") from None
        out = []
        for v in values:
            if v is None:  # expired between SCAN and MGET
                continue
            rec = worker_pb2.WorkerRecord()
            try:
                rec.ParseFromString(v)
            except Exception:  # noqa: BLE001 - a foreign value under our prefix is skipped
                continue
            out.append(rec)
        return sorted(out, key=lambda r: (r.role, r.worker_id))

    def close(self) -> None:
        self._r.close()
